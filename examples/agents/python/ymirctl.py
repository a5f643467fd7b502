"""The agent's side of ymirflow's control channel (YMIR_CONTROL_FD), standard library only.

One request a line, one answer a line, on the descriptor named by YMIR_CONTROL_FD
(examples/agents/README.md, "The control channel"):

    ctl = Control.from_env()          # None when the worker gives no channel
    if ctl.reserve(0.10):             # before an expensive call; False: budget exhausted
        answer = call_the_llm()
        ctl.usage("claude", tokens_in=..., tokens_out=..., cost_usd=..., tool_calls=0)
    ctl.checkpoint({"plan": [...], "completed": [...], "branch_sha": "..."})
    ctl.permit("llm:claude")          # waits until the shared rate allows one call
    ctl.throttled("llm:claude", retry_after_ms=2000)  # the upstream answered 429
    ctl.progress()                    # alive, between reports (PROGRESS_TIMEOUT)

Every request carries the run's fence and a growing sequence number; a request that got
no answer ("unavailable") is sent again with the same number, and ymirflow answers it
once. StaleFence means the run no longer holds its lease: stop, write nothing more.
"""

import json
import os
import socket
import threading
import time


class StaleFence(Exception):
    """The run no longer holds its lease (superseded, lost): stop at once."""


class ChannelClosed(Exception):
    """The worker closed the channel (it ended the run, or died): stop at once."""


class BudgetExhausted(Exception):
    """A reservation was denied: the issue's or the agent's budget is spent."""


class Control:
    RETRIES = 5

    def __init__(self, fd, fence):
        self.sock = socket.socket(fileno=fd)
        self.rfile = self.sock.makefile("rb")
        self.fence = fence
        self.seq = 0
        self.lock = threading.Lock()

    @classmethod
    def from_env(cls):
        fd = os.environ.get("YMIR_CONTROL_FD")
        if not fd:
            return None
        return cls(int(fd), int(os.environ.get("YMIR_FENCE") or "0"))

    def request(self, op, **fields):
        """Sends one request and returns its answer (a dict); retries "unavailable"."""
        with self.lock:
            self.seq += 1
            req = dict(fields, id="r%d" % self.seq, op=op, fence=self.fence, seq=self.seq)
            line = (json.dumps(req) + "\n").encode()
            for attempt in range(self.RETRIES):
                try:
                    self.sock.sendall(line)
                    raw = self.rfile.readline()
                except OSError as e:
                    raise ChannelClosed(str(e))
                if not raw:
                    raise ChannelClosed("the worker closed the control channel")
                ans = json.loads(raw)
                status = ans.get("status")
                if status == "stale_fence":
                    raise StaleFence("the run no longer holds its lease")
                if status in ("unavailable", "rate_limited") and attempt < self.RETRIES - 1:
                    time.sleep(0.05 * (2 ** attempt))
                    continue
                if status == "bad_request":
                    raise ValueError("control: " + ans.get("reason", "bad request"))
                return ans
            return ans

    def usage(self, model, tokens_in=0, tokens_out=0, cost_usd=0.0, tool_calls=0):
        return self.request("usage", model=model, tokens_in=int(tokens_in), tokens_out=int(tokens_out),
                            cost_usd=float(cost_usd), tool_calls=int(tool_calls))

    def reserve(self, amount_usd):
        """True when granted; False when the budget is exhausted."""
        return self.request("reserve", amount_usd=float(amount_usd)).get("status") == "granted"

    def checkpoint(self, state):
        return self.request("checkpoint", checkpoint=state).get("status") == "saved"

    def permit(self, upstream, stopping=None):
        """Waits until upstream may be called (the rate is shared by every worker)."""
        while True:
            ans = self.request("permit", upstream=upstream)
            if ans.get("status") == "granted":
                return
            if stopping is not None and stopping.is_set():
                raise ChannelClosed("stopping")
            time.sleep(max(ans.get("retry_after_ms") or 10, 1) / 1000.0)

    def throttled(self, upstream, retry_after_ms):
        return self.request("throttled", upstream=upstream, retry_after_ms=int(retry_after_ms))

    def progress(self):
        """Says the agent is making progress (a long tool call): with PROGRESS_TIMEOUT
        set, a run that reports none that long loses its lease."""
        return self.request("progress")
