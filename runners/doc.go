// Package runners is how an agent's work runs for one event: the Runner interface that
// the handlers call, the RunRequest they hand it and the Result it reports, and the
// exec runner, which runs an untrusted agent command per event with a least-privilege
// environment (BuildAgentEnv and its EnvPolicy: the coordination store's settings
// never, the worker's own credentials only when named) and a redacted, bounded stderr.
//
// The entry point is ExecRunner; ParseResult is the contract of an agent's stdout (a
// triage result with one of Resolutions, or a downstream result with a boolean
// "success"). A Runner must honour its context: it is cancelled when the lease is lost
// or the worker shuts down, and ExecRunner then ends the agent's whole process group.
//
// The package knows nothing of Watermill, the lease or Jira: a handler (package
// handlers) turns an event into a RunRequest and a Result into labels and requests.
// The simulated agents of `ymirflow demo` and `worker --runner demo` are internal to the
// module (runners/demorunner): their outcome mixes are knobs of the demo, not API.
package runners
