package lease

// ScopedKeys is scopedKeys, for the tests of package lease_test.
func (l *Locker) ScopedKeys(agent, issue string, shared []ScopeKey) Keys {
	return l.scopedKeys(agent, issue, shared)
}
