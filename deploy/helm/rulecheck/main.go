// rulecheck checks Prometheus rules and PromQL expressions with Prometheus' own parser (the code
// `promtool check rules` runs), and prints the metric names each one selects, so the tests can check them
// against the service's registry. Building this is much lighter than building promtool (no service discovery).
//
//	helm template ... | rulecheck rules   # every PrometheusRule in the stream: rulefmt validation (fields,
//	                                      # durations, PromQL, templates); prints [{"group","alert","metrics"}]
//	rulecheck exprs < exprs.json          # a JSON array of PromQL expressions; prints [["metric", ...], ...]
//
// Exit 1 with the errors on stderr when anything does not parse.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

type ruleMetrics struct {
	Group   string   `json:"group"`
	Alert   string   `json:"alert"`
	Record  string   `json:"record"`
	Metrics []string `json:"metrics"`
}

var promql = parser.NewParser(parser.Options{})

// metricNames are the names of the series an expression selects (its `__name__` equality matchers).
func metricNames(expr string) ([]string, error) {
	node, err := promql.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, matchers := range parser.ExtractSelectors(node) {
		for _, m := range matchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				seen[m.Value] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}
	sort.Strings(names)
	return names, nil
}

// split cuts a YAML stream at document separators ("---" lines).
func split(data []byte) [][]byte {
	var docs [][]byte
	var current bytes.Buffer
	scanner := bufio.NewScanner(bytes.NewReader(data))
	scanner.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for scanner.Scan() {
		line := scanner.Text()
		if strings.TrimRight(line, " ") == "---" {
			docs = append(docs, bytes.Clone(current.Bytes()))
			current.Reset()
			continue
		}
		current.WriteString(line)
		current.WriteByte('\n')
	}
	return append(docs, current.Bytes())
}

func checkRules(input []byte) ([]ruleMetrics, []error) {
	var out []ruleMetrics
	var errs []error
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	found := 0
	for _, doc := range split(input) {
		var object struct {
			Kind     string                `json:"kind"`
			Metadata struct{ Name string } `json:"metadata"`
			Spec     json.RawMessage       `json:"spec"`
		}
		if err := yaml.Unmarshal(doc, &object); err != nil {
			errs = append(errs, err)
			continue
		}
		if object.Kind != "PrometheusRule" {
			continue
		}
		found++
		// A PrometheusRule's spec is a rule file ({groups: [...]}); check it as Prometheus loads one.
		content, err := yaml.JSONToYAML(object.Spec)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		groups, parseErrs := rulefmt.Parse(content, false, model.UTF8Validation, promql, logger)
		for _, e := range parseErrs {
			errs = append(errs, fmt.Errorf("%s: %w", object.Metadata.Name, e))
		}
		if groups == nil {
			continue
		}
		for _, group := range groups.Groups {
			for _, rule := range group.Rules {
				names, err := metricNames(rule.Expr)
				if err != nil {
					errs = append(errs, err)
				}
				out = append(out, ruleMetrics{group.Name, rule.Alert, rule.Record, names})
			}
		}
	}
	if found == 0 {
		errs = append(errs, fmt.Errorf("no PrometheusRule in the input"))
	}
	return out, errs
}

func checkExprs(input []byte) ([][]string, []error) {
	var exprs []string
	if err := json.Unmarshal(input, &exprs); err != nil {
		return nil, []error{err}
	}
	var errs []error
	out := make([][]string, 0, len(exprs))
	for i, expr := range exprs {
		names, err := metricNames(expr)
		if err != nil {
			errs = append(errs, fmt.Errorf("expression %d %q: %w", i, expr, err))
		}
		out = append(out, names)
	}
	return out, errs
}

func main() {
	if len(os.Args) != 2 || (os.Args[1] != "rules" && os.Args[1] != "exprs") {
		fmt.Fprintln(os.Stderr, "usage: rulecheck rules|exprs < input")
		os.Exit(2)
	}
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var result any
	var errs []error
	if os.Args[1] == "rules" {
		result, errs = checkRules(input)
	} else {
		result, errs = checkExprs(input)
	}
	for _, e := range errs {
		fmt.Fprintln(os.Stderr, "rulecheck:", e)
	}
	if len(errs) > 0 {
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(result); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
