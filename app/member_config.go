package app

import (
	"flag"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/telha/telha-cascade/member"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/slot"
)

// MemberConfig is the configuration of --partition-owner dynamic (issue 21
// item 3; member.go).
type MemberConfig struct {
	// Dynamic: --partition-owner dynamic[/N]; Config.Owner.Count is N, the
	// slot count, and Owner.Index is meaningless.
	Dynamic bool
	// ID is --member-id (default: the hostname).
	ID string
	// Standbys is --standbys: warm copies of each slot on other members.
	Standbys int
	// TTL is --member-ttl: a member silent this long is gone.
	TTL time.Duration
	// AdvertiseURL is --advertise-url: where the other members forward
	// reads for the slots this member owns.
	AdvertiseURL string
	// ForwardWait is --forward-wait: how long a read waits for its slot to
	// have a serving owner (a move, a failover) before 503.
	ForwardWait time.Duration
	// MaxLag is --standby-max-lag: a standby this close to its owner (in
	// changelog write-sets) has caught up, and a move may flip to it.
	MaxLag uint64
}

func registerMember(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.Member.ID, "member-id", "", "with --partition-owner dynamic: this process's name in the group, unique and stable (default: the hostname)")
	fs.IntVar(&c.Member.Standbys, "standbys", 1, "with --partition-owner dynamic: warm standbys of each slot, each on another member, tailing its changelog so it takes over in seconds")
	fs.DurationVar(&c.Member.TTL, "member-ttl", 6*time.Second, "with --partition-owner dynamic: a member that has not renewed its record for this long is gone and its slots move")
	fs.StringVar(&c.Member.AdvertiseURL, "advertise-url", "", "with --partition-owner dynamic: the base URL other members forward reads to (default http://<host of --http-addr>:<port>, or the hostname when --http-addr listens on every address)")
	fs.DurationVar(&c.Member.ForwardWait, "forward-wait", 10*time.Second, "with --partition-owner dynamic: how long a read waits for its slot's owner during a move or a failover before it is answered 503")
	fs.Uint64Var(&c.Member.MaxLag, "standby-max-lag", 64, "with --partition-owner dynamic: a standby within this many changelog write-sets of its owner has caught up, so a slot may move to it")
}

// parseDynamic reads --partition-owner dynamic[/N].
func (c *Config) parseDynamic() (queue.Owner, bool) {
	rest, ok := strings.CutPrefix(c.PartitionOwner, "dynamic")
	if !ok {
		return queue.Owner{}, false
	}
	c.Member.Dynamic = true
	n := c.Partitions
	if rest != "" {
		v, err := atoiStrict(strings.TrimPrefix(rest, "/"))
		if !strings.HasPrefix(rest, "/") || err != nil || v < 1 {
			return queue.Owner{Count: -1}, true
		}
		n = v
	}
	return queue.Owner{Index: 0, Count: n}, true
}

func atoiStrict(s string) (int, error) {
	var n int
	if s == "" || len(s) > 6 {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("%q is not a number", s)
		}
		n = 10*n + int(r-'0')
	}
	return n, nil
}

// validateMemberRanges checks the dynamic mode's numbers in every mode: a
// value out of range is a mistake whether or not this start uses it (a
// static worker given --standbys 9 would take it the day it turns dynamic).
func (c *Config) validateMemberRanges() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Member.Standbys < 0 || c.Member.Standbys > 4 {
		bad("--standbys must be between 0 and 4, got %d", c.Member.Standbys)
	}
	if c.Member.TTL < time.Second || c.Member.TTL > 10*time.Minute {
		bad("--member-ttl must be between 1s and 10m, got %s", c.Member.TTL)
	}
	if c.Member.ForwardWait < 0 || c.Member.ForwardWait > time.Minute {
		bad("--forward-wait must be between 0 and 1m, got %s", c.Member.ForwardWait)
	}
	// The dynamic mode checks its id (the hostname when none is given);
	// a static start checks one given, as every other dynamic flag.
	if _, dyn := c.parseDynamic(); !dyn && c.Member.ID != "" {
		if err := member.ValidID(c.Member.ID); err != nil {
			bad("--member-id: %v", err)
		}
	}
	return errs
}

func (c *Config) validateDynamic() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o, _ := c.parseDynamic(); o.Count < 1 {
		bad("--partition-owner %q: want dynamic or dynamic/N with N a positive integer", c.PartitionOwner)
	}
	if c.NATSURL == "" {
		bad("--partition-owner dynamic needs --nats-url: its members share one NATS (JetStream, ideally a 3-server cluster); the embedded server is one process's")
	}
	if c.Changelog != slot.ChangelogJetStream {
		bad("--partition-owner dynamic needs --changelog jetstream: the changelog is what lets a slot move to another member")
	}
	if c.Member.ID == "" {
		c.Member.ID = c.Hostname
	}
	if err := member.ValidID(c.Member.ID); err != nil {
		bad("--member-id: %v", err)
	}
	if c.APIAddr != "" {
		bad("--api-addr is not supported with --partition-owner dynamic: the read API is on --http-addr")
	}
	if c.Member.AdvertiseURL == "" {
		host, port, err := net.SplitHostPort(c.HTTPAddr)
		if err != nil {
			bad("--http-addr %q: %v", c.HTTPAddr, err)
		}
		// A specific address the HTTP listens on is where the others can
		// reach it (127.0.0.1 on one machine); the hostname otherwise.
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			host = c.Hostname
		}
		c.Member.AdvertiseURL = "http://" + net.JoinHostPort(host, port)
	} else if !strings.HasPrefix(c.Member.AdvertiseURL, "http://") && !strings.HasPrefix(c.Member.AdvertiseURL, "https://") {
		bad("--advertise-url %q: want http://host:port or https://host:port", c.Member.AdvertiseURL)
	}
	return errs
}
