package pipeline

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// NewLogger returns the process logger: JSON, or console with format "console".
func NewLogger(w io.Writer, level, format string) (zerolog.Logger, error) {
	if w == nil {
		w = os.Stderr
	}
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		if level != "" {
			return zerolog.Nop(), err
		}
		lvl = zerolog.InfoLevel
	}
	if format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// watermillLogger adapts zerolog to watermill.LoggerAdapter, so Watermill's own lines
// land in the same structured log. Watermill's info lines are per-subscription
// chatter; they go to debug.
type watermillLogger struct{ l zerolog.Logger }

func newWatermillLogger(l zerolog.Logger) watermill.LoggerAdapter {
	return watermillLogger{l: l.With().Str("component", "watermill").Logger()}
}

func (w watermillLogger) fields(e *zerolog.Event, f watermill.LogFields) *zerolog.Event {
	if e == nil {
		// The level is off. Watermill logs several trace lines per message; walking
		// their fields for nothing showed in every event's CPU profile.
		return nil
	}
	for k, v := range f {
		switch k {
		case "message_uuid":
			k = "message_uuid"
		case "xid":
			k = "message_id"
		}
		e = e.Interface(k, v)
	}
	return e
}

func (w watermillLogger) Error(msg string, err error, f watermill.LogFields) {
	if errors.Is(err, context.Canceled) || errors.Is(err, redis.ErrClosed) {
		// Shutdown, not a failure.
		w.fields(w.l.Debug().Err(err), f).Msg(msg)
		return
	}
	w.fields(w.l.Error().Err(err), f).Msg(msg)
}
func (w watermillLogger) Info(msg string, f watermill.LogFields)  { w.fields(w.l.Debug(), f).Msg(msg) }
func (w watermillLogger) Debug(msg string, f watermill.LogFields) { w.fields(w.l.Debug(), f).Msg(msg) }
func (w watermillLogger) Trace(msg string, f watermill.LogFields) { w.fields(w.l.Trace(), f).Msg(msg) }
func (w watermillLogger) With(f watermill.LogFields) watermill.LoggerAdapter {
	c := w.l.With()
	for k, v := range f {
		c = c.Interface(k, v)
	}
	return watermillLogger{l: c.Logger()}
}
