package storage

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestKeysBuiltOnlyInKeysGo keeps keys.go's promise true (issue 23 item
// 21: erase.go built two kinds of keys itself): outside keys.go, no code of
// this package puts a keyspace or meta sub-keyspace byte into a []byte
// literal or appends it. (A literal that only lists keyspaces for a range
// loop builds no key.)
func TestKeysBuiltOnlyInKeysGo(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	keyByte := func(e ast.Expr) bool {
		id, ok := e.(*ast.Ident)
		return ok && isKeyConst(id.Name)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		if f == "keys.go" || strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		rangeLists := map[ast.Expr]bool{}
		ast.Inspect(af, func(n ast.Node) bool {
			if rs, ok := n.(*ast.RangeStmt); ok {
				rangeLists[rs.X] = true
			}
			return true
		})
		ast.Inspect(af, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				if rangeLists[n] {
					return true
				}
				for _, e := range n.Elts {
					if keyByte(e) {
						t.Errorf("%s: a key is built outside keys.go (%s in a literal)", fset.Position(n.Pos()), e.(*ast.Ident).Name)
					}
				}
			case *ast.CallExpr:
				if fn, ok := n.Fun.(*ast.Ident); ok && fn.Name == "append" {
					for _, e := range n.Args[1:] {
						if keyByte(e) {
							t.Errorf("%s: a key is built outside keys.go (%s appended)", fset.Position(n.Pos()), e.(*ast.Ident).Name)
						}
					}
				}
			}
			return true
		})
	}
	if checked < 5 {
		t.Fatalf("only %d files checked", checked)
	}
}

// isKeyConst: ksNode, metaErasure (keys.go's constants), not e.g. "meta".
func isKeyConst(name string) bool {
	for _, prefix := range []string{"ks", "meta"} {
		if rest, ok := strings.CutPrefix(name, prefix); ok && rest != "" && rest[0] >= 'A' && rest[0] <= 'Z' {
			return true
		}
	}
	return false
}
