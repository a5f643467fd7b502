// Package inspect answers an operator's questions about a running pipeline: streams
// and consumer groups, pending entries and the leases guarding them, live leases, one
// issue's history across every stream, replays and dead letters. It is the one
// read (and repair) path shared by the ymirflow CLI (--json) and the web console
// (/api/v1/): both render the same structs.
package inspect
