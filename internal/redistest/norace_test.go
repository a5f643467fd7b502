//go:build !race

package redistest_test

const raceEnabled = false
