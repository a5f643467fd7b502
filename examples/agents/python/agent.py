#!/usr/bin/env python3
"""A small ymirflow agent for the exec runner, standard library only.

It shows the whole contract (examples/agents/README.md):

  * the Task JSON on stdin, the YMIR_* variables in the environment;
  * follow-ups read from YMIR_MAILBOX (newline-delimited JSON) while it works, and the
    ones it took into account acknowledged in its result ("followups_acked"); the
    follow-ups of earlier runs that nobody acknowledged come in the Task JSON
    ("followups");
  * YMIR_FENCE stamped on every side effect: a commit trailer and a comment marker,
    and nothing written over a newer run's work (a higher fence);
  * SIGTERM (lease lost, shutdown) handled well within KILL_GRACE: stop, write nothing
    more, exit 143;
  * the result JSON on stdout, everything else on stderr.

With a control channel (YMIR_CONTROL_FD, module ymirctl) it also works in AGENT_STEPS steps
(default 1), each an LLM call: a permit for llm:<AGENT_MODEL>, a reservation of
AGENT_STEP_USD (default 0.01), the call (POST AGENT_LLM_URL/v1/complete, or simulated at
that cost without AGENT_LLM_URL), the usage report, and a checkpoint of the steps done. A
run that finds a checkpoint in its Task JSON ("checkpoint") skips the steps it lists. A
denied reservation ends the run (exit 2: ymirflow records budget.exhausted and parks the
issue); a 429 is reported (the permits of every worker shrink) and the call retried.

Its "work" is simulated: it waits AGENT_WORK_MS milliseconds (default 300), then
commits a note into a git repository and writes a comment file under AGENT_WORKDIR
(default $TMPDIR/ymir-agent-kit), one per issue. Triage answers AGENT_RESOLUTION
(default "postponed"); the other agents answer success. The mailbox's opening and each
follow-up's arrival are noted in AGENT_WORKDIR/<agent>/mailbox-<issue>.log; AGENT_NO_ACK=1 acknowledges none.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ymirctl  # noqa: E402  (beside this file: the kit's client of the control channel)

TRAILER = "Ymir-Fence"
MARKER = re.compile(r"<!-- ymir-fence: (\S+) (\S+) (\d+) -->")


def log(msg):
    print("agent: " + msg, file=sys.stderr, flush=True)


class Stop(Exception):
    """SIGTERM arrived: the lease is lost or the worker shuts down."""


class Agent:
    def __init__(self):
        self.agent = os.environ["YMIR_AGENT"]
        self.issue = os.environ["YMIR_ISSUE_KEY"]
        self.fence = int(os.environ.get("YMIR_FENCE") or "0")
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.followups = []  # read from the mailbox during this run, in its order
        workdir = os.environ.get("AGENT_WORKDIR") or os.path.join(
            os.environ.get("TMPDIR") or "/tmp", "ymir-agent-kit")
        self.workdir = os.path.join(workdir, self.agent)

    # --- SIGTERM: only set a flag; the work loop checks it between steps.
    def on_term(self, signum, frame):
        self.stopping.set()

    def check(self):
        if self.stopping.is_set():
            raise Stop()

    # --- the mailbox: one follow-up per line, until the worker closes it (run's end).
    def read_mailbox(self, path):
        try:
            with open(path, "r", encoding="utf-8") as f:
                self.trace({"mailbox": "open"})
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        fu = json.loads(line)
                    except ValueError:
                        log("mailbox: skipping a line that is not JSON")
                        continue
                    with self.lock:
                        self.followups.append(fu)
                    self.trace(fu)
                    log("follow-up %s from %s: %s" % (fu.get("id"), fu.get("author") or "?",
                                                     (fu.get("body") or fu.get("event_type") or "")[:80]))
        except OSError as e:
            log("mailbox: %s" % e)

    def trace(self, fu):
        """Notes the follow-up's arrival (a file per issue), for whoever watches the agent."""
        os.makedirs(self.workdir, exist_ok=True)
        with open(os.path.join(self.workdir, "mailbox-" + self.issue + ".log"), "a", encoding="utf-8") as f:
            f.write(json.dumps(fu) + "\n")

    # --- fenced side effects.
    def fence_tag(self):
        return "%s/%s/%d" % (self.agent, self.issue, self.fence)

    def commit(self, note):
        """Commits note with the fence trailer, unless HEAD carries a higher fence."""
        repo = os.path.join(self.workdir, "repo-" + self.issue)
        os.makedirs(repo, exist_ok=True)
        git = ["git", "-C", repo, "-c", "user.name=ymir agent", "-c", "user.email=agent@ymirflow.invalid"]
        if not os.path.isdir(os.path.join(repo, ".git")):
            subprocess.run(git + ["init", "-q"], check=True, stdout=sys.stderr)
        head = subprocess.run(git + ["log", "-1", "--format=%(trailers:key=" + TRAILER + ",valueonly)"],
                              capture_output=True, text=True)
        for value in head.stdout.split():
            theirs = int(value.rsplit("/", 1)[-1])
            if theirs > self.fence:
                raise RuntimeError("refusing to commit: HEAD carries fence %d, newer than ours (%d)"
                                   % (theirs, self.fence))
        with open(os.path.join(repo, "NOTES"), "a", encoding="utf-8") as f:
            f.write(note + "\n")
        self.check()  # the last moment to give up before the side effect
        subprocess.run(git + ["add", "NOTES"], check=True, stdout=sys.stderr)
        subprocess.run(git + ["commit", "-q", "-m", note, "--trailer", TRAILER + ": " + self.fence_tag()],
                       check=True, stdout=sys.stderr)

    def comment(self, text):
        """Writes the issue's comment with the fence marker, unless it holds a higher one.

        A real agent edits a Jira comment or a merge request description the same way:
        read, compare the marker's fence, write only if ours is not older."""
        path = os.path.join(self.workdir, "comments", self.issue + ".md")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path, encoding="utf-8") as f:
                for m in MARKER.finditer(f.read()):
                    if m.group(1) == self.agent and m.group(2) == self.issue and int(m.group(3)) > self.fence:
                        log("comment: skipped, it holds fence %s, newer than ours (%d)" % (m.group(3), self.fence))
                        return False
        except FileNotFoundError:
            pass
        self.check()
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("%s\n\n<!-- ymir-fence: %s %s %d -->\n" % (text, self.agent, self.issue, self.fence))
        os.replace(tmp, path)
        return True

    # --- the control channel: fenced, metered LLM calls that resume from a checkpoint.
    def llm_steps(self, ctl, task):
        steps = int(os.environ.get("AGENT_STEPS") or "1")
        model = os.environ.get("AGENT_MODEL") or "fake"
        cost = float(os.environ.get("AGENT_STEP_USD") or "0.01")
        plan = ["step-%d" % i for i in range(1, steps + 1)]
        done = list(((task.get("checkpoint") or {}).get("completed")) or [])
        if done:
            log("resuming from a checkpoint: %d of %d steps done" % (len(done), len(plan)))
        for step in plan:
            if step in done:
                continue
            self.check()
            ctl.permit("llm:" + model, self.stopping)
            if not ctl.reserve(cost):
                raise ymirctl.BudgetExhausted("reservation of %.4f USD denied" % cost)
            ans = self.call_llm(ctl, model, cost)
            ctl.usage(model, ans["tokens_in"], ans["tokens_out"], ans["cost_usd"], tool_calls=1)
            done.append(step)
            ctl.checkpoint({"plan": plan, "completed": done, "branch_sha": ""})
        return len(done)

    def call_llm(self, ctl, model, cost):
        url = os.environ.get("AGENT_LLM_URL")
        if not url:
            return {"tokens_in": 100, "tokens_out": 20, "cost_usd": cost}
        while True:
            req = urllib.request.Request(url + "/v1/complete", data=json.dumps({"model": model, "agent": self.agent}).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    return json.load(resp)
            except urllib.error.HTTPError as e:
                if e.code != 429:
                    raise
                after = int(e.headers.get("Retry-After") or "1")
                ctl.throttled("llm:" + model, after * 1000)
                ctl.permit("llm:" + model, self.stopping)

    def run(self, task):
        signal.signal(signal.SIGTERM, self.on_term)
        log("started: %s %s, fence %d" % (self.agent, self.issue, self.fence))  # the handler is in place
        mailbox = os.environ.get("YMIR_MAILBOX")
        if mailbox:
            threading.Thread(target=self.read_mailbox, args=(mailbox,), daemon=True).start()
        earlier = task.get("followups") or []  # unacknowledged follow-ups of earlier runs
        for fu in earlier:
            log("follow-up %s (from an earlier run) from %s" % (fu.get("id"), fu.get("author") or "?"))

        ctl = ymirctl.Control.from_env()
        if ctl is not None:
            self.llm_steps(ctl, task)

        # The work: in short steps, so SIGTERM is seen within 50 ms.
        deadline = time.monotonic() + int(os.environ.get("AGENT_WORK_MS") or "300") / 1000.0
        while time.monotonic() < deadline:
            self.check()
            time.sleep(0.05)
        self.check()
        with self.lock:
            live = list(self.followups)
        heard = earlier + live
        note = "%s %s: done (fence %d), %d follow-up(s) heard" % (self.agent, self.issue, self.fence, len(heard))
        self.commit(note)
        self.comment(note + "".join("\n- %s: %s" % (fu.get("author") or "?", fu.get("body") or "") for fu in heard))

        # Acknowledge what this run took into account; AGENT_NO_ACK=1 plays an agent that
        # did not (its follow-ups then start the next run).
        acked = [] if os.environ.get("AGENT_NO_ACK") == "1" else [fu["id"] for fu in live if "id" in fu]
        result = {"followups_acked": acked}
        data = {"details": note, "followups": [fu.get("id") for fu in heard], "fence": self.fence}
        if self.agent == "triage":
            result.update(resolution=os.environ.get("AGENT_RESOLUTION") or "postponed", data=data)
            if os.environ.get("AGENT_TARGET_BRANCH"):
                result["target_branch"] = os.environ["AGENT_TARGET_BRANCH"]
        else:
            result.update(success=True, merge_request_url="", error="")
        return result


def main():
    task = json.load(sys.stdin)
    agent = Agent()
    try:
        result = agent.run(task)
    except Stop:
        log("SIGTERM: stopping, nothing more written")
        return 143
    except (ymirctl.StaleFence, ymirctl.ChannelClosed) as e:
        log("the run is over (%s): stopping, nothing more written" % e)
        return 143
    except ymirctl.BudgetExhausted as e:
        log("budget exhausted: %s" % e)
        return 2
    except Exception as e:  # a failed attempt: the worker retries, then dead-letters
        log("failed: %s" % e)
        return 1
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
