//go:build race

package redistest_test

// raceEnabled: the test binary was built with -race, so the `go test` it runs can reuse
// the packages the outer run compiled.
const raceEnabled = true
