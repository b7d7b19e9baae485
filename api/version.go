package api

import (
	"encoding/json"

	"github.com/telha/telha-cascade/storage"
)

// Version is the JSON shape of a version record (CONTRACT §6). Times are RFC
// 3339 UTC with six fractional digits; open ends are null; tx_to is always
// null (versions are never closed; latest-tx-wins decides supersession).
type Version struct {
	ID         string          `json:"id"`
	Src        *string         `json:"src"`
	Dst        *string         `json:"dst"`
	Label      *string         `json:"label"`
	ValidFrom  *string         `json:"valid_from"`
	ValidTo    *string         `json:"valid_to"`
	TxFrom     *string         `json:"tx_from"`
	TxTo       *string         `json:"tx_to"`
	Tombstone  bool            `json:"tombstone"`
	Erased     bool            `json:"erased"` // payload erased (props null; actor, reason, source "")
	Props      json.RawMessage `json:"props"`
	Provenance Provenance      `json:"provenance"`
}

// Provenance is the JSON shape of a version's provenance.
type Provenance struct {
	Actor     string  `json:"actor"`
	Reason    string  `json:"reason"`
	Source    string  `json:"source"`
	RequestID string  `json:"request_id"`
	DecidedAt *string `json:"decided_at"`
}

func ts(t storage.Ts) *string {
	if t == storage.OpenEnd || t == storage.NoTs {
		return nil
	}
	s := t.Time().Format(storage.TimeLayout)
	return &s
}

// VersionJSON shapes a version for the API.
func VersionJSON(v *storage.Version) Version {
	out := Version{
		ID:        v.ID.String(),
		ValidFrom: ts(v.Valid.Start),
		ValidTo:   ts(v.Valid.End),
		TxFrom:    ts(v.Tx.Start),
		TxTo:      ts(v.Tx.End),
		Tombstone: v.Tombstone,
		Props:     json.RawMessage(v.Props),
		Provenance: Provenance{Actor: v.Prov.Actor, Reason: v.Prov.Reason, Source: v.Prov.Source,
			RequestID: v.Prov.RequestID, DecidedAt: ts(v.Prov.DecidedAt)},
	}
	if len(out.Props) == 0 || !json.Valid(out.Props) {
		out.Props = json.RawMessage("{}")
	}
	if v.Erased {
		out.Erased, out.Props = true, json.RawMessage("null")
	}
	if v.Kind == storage.KindEdge {
		src, dst, label := v.Src.String(), v.Dst.String(), v.Label
		out.Src, out.Dst, out.Label = &src, &dst, &label
	}
	return out
}
