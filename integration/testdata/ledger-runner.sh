#!/bin/sh
# ledger-runner.sh: the exec runner of the integration tests (run as
# `exec bash ledger-runner.sh`, or sh without bash, so $PPID is the worker process).
#
# It appends one "start" line when it begins and one "end" line when it ends (normally,
# or on SIGTERM from the worker: lease lost, shutdown) to $LEDGER, each a single short
# O_APPEND write:
#
#   start AGENT BRANCH ISSUE FENCE ATTEMPT WORKER_PID RUNNER_PID MESSAGE_ID UNIX_NS
#   end   AGENT BRANCH ISSUE FENCE ATTEMPT WORKER_PID RUNNER_PID MESSAGE_ID UNIX_NS ok|term
#
# A run whose worker is SIGKILLed has no end line (the shell dies with its worker through
# the parent-death signal); the test takes the kill's time as its end.
#
# It sleeps a random time in [RUNNER_MIN_MS, RUNNER_MAX_MS] (RUNNER_SLOW_ISSUE=KEY:MS
# overrides one issue), then answers the JSON contract. Outcomes are a function of the
# issue number N (KEY = PROJ-N), so a re-run decides as the first run did:
#   triage:     N%20==0 not-affected, N%20==1 postponed, else rebase/backport/rebuild by N%3,
#               target branch rhel-9.6.0 (c9s) or rhel-10.1 (c10s) by (N/3)%2;
#   downstream: N%17==5 {"success":false} (retried, then _errored and dead-lettered),
#               else success; RUNNER_NO_FAIL=1: always success.
#
# RUNNER_ACK_MAILBOX=1 (ON_CONFLICT deliver): before answering it reads the follow-ups
# fed to YMIR_MAILBOX so far and acknowledges those whose stream id has an even ms part
# (followups_acked); the others start the issue's next run.
L=${LEDGER:?LEDGER is not set}
ids="$YMIR_AGENT ${YMIR_BRANCH:--} $YMIR_ISSUE_KEY ${YMIR_FENCE:-0} ${YMIR_ATTEMPT:-0} $PPID $$ ${YMIR_MESSAGE_ID:--}"
# now sets t to the time in ns. The worker's SIGTERM goes to the whole process group, so it
# can kill the date of a command substitution and leave t empty: then ask again (the
# worker sends one SIGTERM; its SIGKILL, after the grace, ends this shell too).
now() {
	if [ -n "${EPOCHREALTIME:-}" ]; then
		# bash 5: no fork, so nothing for the SIGTERM to kill either
		t=${EPOCHREALTIME%.*}${EPOCHREALTIME#*.}000
		return
	fi
	t=$(date +%s%N)
	[ -n "$t" ] || t=$(date +%s%N)
}
fu=${TMPDIR:-/tmp}/ledger-runner-$$.mailbox
# A SIGTERM that comes while the start line is written (a newer event superseded the
# run as it began) must still end with an end line: until the TERM trap that writes it
# is set, a signal is only noted, and acted on right after. One that comes before this
# first trap ends the shell before it wrote anything: no start, no end.
trap 'term=1' TERM INT
now
echo "start $ids $t" >>"$L"
trap 'now; echo "end $ids $t term" >>"$L"; rm -f "$fu"; exit 143' TERM INT
if [ -n "${term:-}" ]; then
	now
	echo "end $ids $t term" >>"$L"
	exit 143
fi

cat >/dev/null

min=${RUNNER_MIN_MS:-20}
max=${RUNNER_MAX_MS:-150}
r=$(od -An -N2 -tu2 /dev/urandom)
ms=$((min + r % (max - min + 1)))
case "$RUNNER_SLOW_ISSUE" in
"$YMIR_ISSUE_KEY":*) ms=${RUNNER_SLOW_ISSUE#*:} ;;
esac
# sleep in the background and wait for it: the TERM trap then runs at once.
sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))" &
wait $!

acks=
if [ -n "${RUNNER_ACK_MAILBOX:-}" ] && [ -n "${YMIR_MAILBOX:-}" ]; then
	# The feed keeps the pipe open while the run lasts: read what is there, then stop.
	timeout 0.1 cat "$YMIR_MAILBOX" >"$fu" &
	wait $!
	for id in $(sed -n 's/.*"id":"\([^"]*\)".*/\1/p' "$fu"); do
		case $id in *[02468]-*) acks="$acks${acks:+,}\"$id\"" ;; esac
	done
	rm -f "$fu"
fi

n=${YMIR_ISSUE_KEY##*-}
out=
if [ "$YMIR_AGENT" = triage ]; then
	if [ $((n % 20)) -eq 0 ]; then
		out='{"resolution":"not-affected","data":{"details":"simulated"}}'
	elif [ $((n % 20)) -eq 1 ]; then
		out='{"resolution":"postponed","data":{"details":"simulated"}}'
	else
		case $((n % 3)) in
		0) res=rebase ;;
		1) res=backport ;;
		*) res=rebuild ;;
		esac
		if [ $((n / 3 % 2)) -eq 0 ]; then br=rhel-9.6.0; else br=rhel-10.1; fi
		out="{\"resolution\":\"$res\",\"target_branch\":\"$br\",\"data\":{\"jira_issue\":\"$YMIR_ISSUE_KEY\"}}"
	fi
elif [ $((n % 17)) -eq 5 ] && [ "${RUNNER_NO_FAIL:-}" != 1 ]; then
	out='{"success":false,"error":"simulated failure"}'
else
	out="{\"success\":true,\"merge_request_url\":\"https://gitlab.example/mr/$n\",\"followups_acked\":[$acks]}"
fi
now
echo "end $ids $t ok" >>"$L"
echo "$out"
