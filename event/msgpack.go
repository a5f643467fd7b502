package event

import "github.com/vmihailenco/msgpack"

// msgpackUnmarshal reads the metadata blob of a stock watermill-redisstream entry, with
// the same library and version it is written with.
func msgpackUnmarshal(b []byte, v any) error { return msgpack.Unmarshal(b, v) }
