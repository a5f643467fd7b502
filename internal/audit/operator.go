package audit

import "context"

// Operator is who asks for a write, from where and why: what the CLI or the console
// knows of the request, carried in its context to the code that writes (the Inspector),
// which adds the action and its scope (Operator.Entry).
type Operator struct {
	Who, From, Role, Reason string
}

type operatorKey struct{}

// WithOperator returns ctx carrying op.
func WithOperator(ctx context.Context, op Operator) context.Context {
	return context.WithValue(ctx, operatorKey{}, op)
}

// OperatorFrom returns the operator of ctx (zero when none: Do then refuses the write).
func OperatorFrom(ctx context.Context) Operator {
	op, _ := ctx.Value(operatorKey{}).(Operator)
	return op
}

// Entry is the record of op's write action on scope, touching issues.
func (op Operator) Entry(action, scope string, issues ...string) Entry {
	return Entry{Who: op.Who, From: op.From, Role: op.Role, Reason: op.Reason, Action: action, Scope: scope, Issues: issues}
}
