package jira

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"unicode/utf8"
)

// Sentinel errors. An *HTTPError with the matching status wraps one of them, so
// errors.Is(err, ErrNotFound) works on anything a Client method returns.
var (
	// ErrUnauthorized is a 401: missing or wrong credentials (Options.Email and Token).
	ErrUnauthorized = errors.New("jira: unauthorized (check the e-mail and token)")
	// ErrForbidden is a 403: the account may not do this.
	ErrForbidden = errors.New("jira: forbidden")
	// ErrNotFound is a 404: no such issue or user, or no permission to see it.
	ErrNotFound = errors.New("jira: not found")
	// ErrRateLimited is a 429 that outlived the retries.
	ErrRateLimited = errors.New("jira: rate limited")
	// ErrNotConfigured is returned by reads on a Client built without a BaseURL (dry-run only).
	ErrNotConfigured = errors.New("jira: no BaseURL is set, only dry-run writes are possible")
	// ErrTokenRequired is New's error for Options with a BaseURL and no Token.
	ErrTokenRequired = errors.New("jira: Token: required when BaseURL is set")
	// ErrStop, returned by a SearchAll callback, ends the iteration without an error.
	ErrStop = errors.New("jira: stop iteration")
	// ErrRedirect is a redirect to another scheme, host or port, refused: the request
	// carries the Authorization header, which must not reach anyone else.
	ErrRedirect = errors.New("jira: redirect to another origin refused")
	// ErrPaging is a search whose pages do not advance, or that passed MaxSearchPages.
	ErrPaging = errors.New("jira: search paging")
)

// maxErrorBody bounds HTTPError.Body.
const maxErrorBody = 1024

// HTTPError is a non-2xx answer from Jira (after retries, when the status was retryable).
type HTTPError struct {
	StatusCode int
	Method     string
	// Path is the request path without the query string (no credentials are ever in it).
	Path string
	// Body is the start of the response body, at most 1 KiB.
	Body string
	// Messages are Jira's errorMessages and errors, when the body had them.
	Messages []string
	// Attempts is how many times the request was sent.
	Attempts int
}

// Error implements error.
func (e *HTTPError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "jira: %s %s: %d %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode))
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " (after %d attempts)", e.Attempts)
	}
	switch {
	case len(e.Messages) > 0:
		b.WriteString(": ")
		b.WriteString(strings.Join(e.Messages, "; "))
	case e.Body != "":
		b.WriteString(": ")
		b.WriteString(e.Body)
	}
	return b.String()
}

// Unwrap returns the sentinel for the status (ErrUnauthorized, ErrForbidden, ErrNotFound,
// ErrRateLimited), or nil.
func (e *HTTPError) Unwrap() error {
	switch e.StatusCode {
	case http.StatusUnauthorized:
		return ErrUnauthorized
	case http.StatusForbidden:
		return ErrForbidden
	case http.StatusNotFound:
		return ErrNotFound
	case http.StatusTooManyRequests:
		return ErrRateLimited
	}
	return nil
}

// Retryable reports whether the status is one a later attempt may cure (429, 5xx).
func (e *HTTPError) Retryable() bool {
	return e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500
}

// newHTTPError builds an HTTPError from a response body.
func newHTTPError(method, path string, status int, body []byte) *HTTPError {
	e := &HTTPError{StatusCode: status, Method: method, Path: path, Body: truncate(body, maxErrorBody)}
	var jerr struct {
		ErrorMessages []string          `json:"errorMessages"`
		Errors        map[string]string `json:"errors"`
	}
	if json.Unmarshal(body, &jerr) == nil {
		e.Messages = append(e.Messages, jerr.ErrorMessages...)
		keys := make([]string, 0, len(jerr.Errors))
		for k := range jerr.Errors {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			e.Messages = append(e.Messages, k+": "+jerr.Errors[k])
		}
	}
	return e
}

// truncate returns at most n bytes of b as a string, cut on a rune boundary, with "…" when cut.
func truncate(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
