// Replaces gitleaks' cmd/generate/secrets/regen.go (through `go build -overlay`,
// see scripts/gitleaks-fresh-samples): the same generator, seeded from
// MOAT_SAMPLES_SEED so that a run can be repeated; each secret takes the next seed.

package secrets

import (
	"os"
	"strconv"

	"github.com/lucasjones/reggen"
)

var seed = func() int64 {
	s, err := strconv.ParseInt(os.Getenv("MOAT_SAMPLES_SEED"), 10, 64)
	if err != nil {
		panic("MOAT_SAMPLES_SEED: " + err.Error())
	}
	return s * 1_000_003
}()

func NewSecret(regex string) string {
	g, err := reggen.NewGenerator(regex)
	if err != nil {
		panic(err)
	}
	seed++
	g.SetSeed(seed)
	return g.Generate(1)
}
