// Package progress shows what a local pipeline does, for `ymirflow demo` and
// `ymirflow dev`: Display keeps a block of live counters at the bottom of a terminal
// (plain lines elsewhere), Tally reads the results and dead-letter streams as they grow
// and counts, per stage, the outcomes they record, and Lines bounds how many lines a
// second reach the screen.
package progress
