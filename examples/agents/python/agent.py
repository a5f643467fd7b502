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

    def run(self, task):
        signal.signal(signal.SIGTERM, self.on_term)
        log("started: %s %s, fence %d" % (self.agent, self.issue, self.fence))  # the handler is in place
        mailbox = os.environ.get("YMIR_MAILBOX")
        if mailbox:
            threading.Thread(target=self.read_mailbox, args=(mailbox,), daemon=True).start()
        earlier = task.get("followups") or []  # unacknowledged follow-ups of earlier runs
        for fu in earlier:
            log("follow-up %s (from an earlier run) from %s" % (fu.get("id"), fu.get("author") or "?"))

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
    except Exception as e:  # a failed attempt: the worker retries, then dead-letters
        log("failed: %s" % e)
        return 1
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
