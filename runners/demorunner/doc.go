// Package demorunner simulates ymirflow's agents for `ymirflow demo`, `ymirflow dev`,
// `worker --runner demo` and tests: Runner is a runners.Runner whose outcome, target
// branch and duration are a hash of its seed, the agent, the issue key and the attempt.
//
// It is internal because its knobs (the outcome mixes, PickWeighted, ErrCrash) exist for
// the demo's scenarios and tests, not for users of package runners.
package demorunner
