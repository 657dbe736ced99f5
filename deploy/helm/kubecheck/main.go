// kubecheck reads Kubernetes manifests (multi-document YAML, as `helm template` prints them) on stdin and
// decodes each built-in object strictly into its Go type from k8s.io/api: an unknown or misplaced field, or a
// value of the wrong type, is an error. helm lint does not check this, and the tests have no cluster to ask.
// Custom resources (ServiceMonitor, ScaledObject, PrometheusRule) are listed as skipped.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

func newObject(apiVersion, kind string) any {
	switch apiVersion + "/" + kind {
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "v1/Secret":
		return &corev1.Secret{}
	case "v1/Service":
		return &corev1.Service{}
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1/Pod":
		return &corev1.Pod{}
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}
	case "batch/v1/Job":
		return &batchv1.Job{}
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}
	}
	return nil
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

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubecheck: read stdin:", err)
		os.Exit(2)
	}
	failed := false
	for _, doc := range split(data) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			fmt.Printf("FAIL  unparsable document: %v\n", err)
			failed = true
			continue
		}
		if meta.Kind == "" {
			continue // an empty document (comments only)
		}
		name := fmt.Sprintf("%s/%s %s", meta.APIVersion, meta.Kind, meta.Metadata.Name)
		object := newObject(meta.APIVersion, meta.Kind)
		if object == nil {
			fmt.Printf("SKIP  %s (not a built-in type)\n", name)
			continue
		}
		if err := yaml.UnmarshalStrict(doc, object); err != nil {
			fmt.Printf("FAIL  %s: %v\n", name, err)
			failed = true
			continue
		}
		fmt.Printf("OK    %s\n", name)
	}
	if failed {
		os.Exit(1)
	}
}
