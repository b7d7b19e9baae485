package storage

import (
	"fmt"
	"regexp"
)

var tenantRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Scope is a validated tenant. Every key and operation is scoped to one; the
// zero Scope is invalid and rejected by every Store method.
type Scope struct{ tenant string }

// NewScope validates tenant against ^[a-z0-9][a-z0-9_-]{0,62}$.
func NewScope(tenant string) (Scope, error) {
	if !tenantRE.MatchString(tenant) {
		return Scope{}, fmt.Errorf("%w: tenant %q must match %s", ErrInvalid, tenant, tenantRE)
	}
	return Scope{tenant: tenant}, nil
}

// MustScope is NewScope for constants in tests and tools; it panics on error.
func MustScope(tenant string) Scope {
	s, err := NewScope(tenant)
	if err != nil {
		panic(err)
	}
	return s
}

// ValidTenant reports whether tenant is a well-formed tenant id.
func ValidTenant(tenant string) bool { return tenantRE.MatchString(tenant) }

// Tenant returns the tenant id.
func (s Scope) Tenant() string { return s.tenant }

// IsZero reports whether s is the zero Scope.
func (s Scope) IsZero() bool { return s.tenant == "" }

func (s Scope) String() string { return s.tenant }
