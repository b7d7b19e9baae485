package metrics

import (
	"runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// PartitionSample is one slot as a member of a dynamic group sees it (issue
// 21 item 4), read at each scrape.
type PartitionSample struct {
	Slot int
	// Role: "owner", "standby" or "" (neither, on this member).
	Role string
	// Epoch of the slot's assignment (every member knows it).
	Epoch uint64
	// Applied: this member's applied changelog sequence of the slot (0:
	// holds none). Lag: the owner's applied minus this member's, for a
	// standby.
	Applied, Lag uint64
	// CheckpointAge: seconds since this member's last checkpoint of the
	// slot (owner only; < 0: none yet). StartSeconds: how long its last
	// start took (restore and replay; 0: none).
	CheckpointAge, StartSeconds float64
}

// MemberState is what the member collector reads.
type MemberState struct {
	// Slots is the group's slot count (N of dynamic/N): each slot's
	// counters start at 0.
	Slots      int
	Partitions func() []PartitionSample
	Members    func() int
	// Moves counts changes of owner this member has seen, Fenced the
	// starts of this member that fenced a previous writer (a claim over a
	// live or frozen owner).
	Moves, Fenced func() uint64
}

// MemberMetrics is a dynamic member's own families (the slots' stores have
// their own registries, merged at /metrics with a slot label):
// telha_partition_*, telha_member_*, and telha_api_denied_total for the
// reads the member refuses itself (it checks every caller once, for all
// its slots: those series carry no slot label).
type MemberMetrics struct {
	Registry      *prometheus.Registry
	apiDenied     *prometheus.CounterVec
	deniedReasons map[string]bool
	standbyReads  *prometheus.CounterVec
	slowOwner     *prometheus.CounterVec
}

// NewMemberMetrics registers a member's families; deniedReasons are the
// reasons of telha_api_denied_total (each starts at 0).
func NewMemberMetrics(b Build, st MemberState, deniedReasons []string) *MemberMetrics {
	r := prometheus.NewRegistry()
	bi := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "telha_build_info", Help: "Build of the running worker (value 1).",
	}, []string{"version", "revision", "goversion"})
	bi.WithLabelValues(b.Version, b.Revision, runtime.Version()).Set(1)
	m := &MemberMetrics{Registry: r, apiDenied: newAPIDenied(), deniedReasons: setOf(deniedReasons),
		standbyReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "telha_partition_standby_reads_total",
			Help: "Entity reads this member's standby copy of the slot answered (no owner answered them, or the owner was slow).",
		}, []string{"slot"}),
		slowOwner: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "telha_member_slow_owner_reads_total",
			Help: "Reads this member forwarded to a slot's owner that had not begun to answer within 500 ms, by who answered them (standby, owner, none).",
		}, []string{"answered"}),
	}
	for _, reason := range deniedReasons {
		m.apiDenied.WithLabelValues(reason)
	}
	for _, a := range []string{SlowOwnerStandby, SlowOwnerOwner, SlowOwnerNone} {
		m.slowOwner.WithLabelValues(a)
	}
	for slot := range st.Slots {
		m.standbyReads.WithLabelValues(strconv.Itoa(slot))
	}
	r.MustRegister(bi, &memberCollector{st: st}, m.apiDenied, m.standbyReads, m.slowOwner,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Denied counts a read the member refused (access control).
func (m *MemberMetrics) Denied(reason string) {
	m.apiDenied.WithLabelValues(known(m.deniedReasons, reason, Other)).Inc()
}

// StandbyRead counts an entity read answered from this member's standby
// copy of slot.
func (m *MemberMetrics) StandbyRead(slot int) {
	m.standbyReads.WithLabelValues(strconv.Itoa(slot)).Inc()
}

// Who answered a read whose owner was slow (telha_member_slow_owner_reads_total).
const (
	SlowOwnerStandby = "standby"
	SlowOwnerOwner   = "owner"
	SlowOwnerNone    = "none" // the slot moved, or the client gave up
)

// SlowOwner counts a forwarded read whose owner had not begun to answer
// within the member's hedge delay, by who answered it.
func (m *MemberMetrics) SlowOwner(answered string) {
	m.slowOwner.WithLabelValues(answered).Inc()
}

// SlotGatherer gathers a slot's registry with the label slot="<slot>" on
// every series, leaving out the process-wide families (go_*, process_*,
// telha_build_info) that the member's own registry already has, and
// telha_api_denied_total, which the member counts (it checks every read
// once, for all its slots: a slot's series would stay 0).
func SlotGatherer(slot int, g prometheus.Gatherer) prometheus.Gatherer {
	label := &dto.LabelPair{Name: proto.String("slot"), Value: proto.String(strconv.Itoa(slot))}
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		fams, err := g.Gather()
		out := fams[:0]
		for _, f := range fams {
			n := f.GetName()
			if strings.HasPrefix(n, "go_") || strings.HasPrefix(n, "process_") || n == "telha_build_info" || n == "telha_api_denied_total" {
				continue
			}
			for _, m := range f.Metric {
				m.Label = append(m.Label, label)
				sort.Slice(m.Label, func(i, j int) bool { return m.Label[i].GetName() < m.Label[j].GetName() })
			}
			out = append(out, f)
		}
		return out, err
	})
}

var (
	descRole = prometheus.NewDesc("telha_partition_role", "1 for the role this member holds for the slot (owner, standby, or broken: Pebble failed on its copy and the member gave the slot up until it restarts); 0 for the others.",
		[]string{"slot", "role"}, nil)
	descEpoch   = prometheus.NewDesc("telha_partition_epoch", "Epoch of the slot's assignment: grows by one with each change of owner.", []string{"slot"}, nil)
	descApplied = prometheus.NewDesc("telha_partition_applied_sequence", "Changelog sequence this member's copy of the slot reflects (0: holds none).", []string{"slot"}, nil)
	descLag     = prometheus.NewDesc("telha_partition_standby_lag", "Changelog write-sets this member's standby copy of the slot is behind its owner.", []string{"slot"}, nil)
	descCkpt    = prometheus.NewDesc("telha_partition_checkpoint_age_seconds", "Seconds since this member's last checkpoint of a slot it owns.", []string{"slot"}, nil)
	descStart   = prometheus.NewDesc("telha_partition_start_seconds", "How long this member's last start of the slot took (restore of a checkpoint and replay of the changelog).", []string{"slot"}, nil)
	descMembers = prometheus.NewDesc("telha_member_live_members", "Live members of the group, as this member last read them.", nil, nil)
	descMoves   = prometheus.NewDesc("telha_partition_moves_total", "Changes of a slot's owner this member has seen.", nil, nil)
	descFenced  = prometheus.NewDesc("telha_partition_fence_claims_total", "Starts of a slot on this member that fenced a previous writer by claiming its changelog.", nil, nil)
)

// RoleBroken is telha_partition_role's role of a slot whose copy Pebble
// failed on in this process: the member gave it up until it restarts.
const RoleBroken = "broken"

type memberCollector struct{ st MemberState }

func (c *memberCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRole, descEpoch, descApplied, descLag, descCkpt, descStart, descMembers, descMoves, descFenced} {
		ch <- d
	}
}

func (c *memberCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.st.Partitions() {
		s := strconv.Itoa(p.Slot)
		for _, role := range []string{"owner", "standby", RoleBroken} {
			v := 0.0
			if p.Role == role {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descRole, prometheus.GaugeValue, v, s, role)
		}
		ch <- prometheus.MustNewConstMetric(descEpoch, prometheus.GaugeValue, float64(p.Epoch), s)
		ch <- prometheus.MustNewConstMetric(descApplied, prometheus.GaugeValue, float64(p.Applied), s)
		if p.Role == "standby" {
			ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, float64(p.Lag), s)
		}
		if p.Role == "owner" && p.CheckpointAge >= 0 {
			ch <- prometheus.MustNewConstMetric(descCkpt, prometheus.GaugeValue, p.CheckpointAge, s)
		}
		if p.StartSeconds > 0 {
			ch <- prometheus.MustNewConstMetric(descStart, prometheus.GaugeValue, p.StartSeconds, s)
		}
	}
	ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(c.st.Members()))
	ch <- prometheus.MustNewConstMetric(descMoves, prometheus.CounterValue, float64(c.st.Moves()))
	ch <- prometheus.MustNewConstMetric(descFenced, prometheus.CounterValue, float64(c.st.Fenced()))
}
