// Package helm decodes every object the tierproxy chart renders into its Go type, strictly:
// an unknown or misspelled field, a duplicate field or a kind nobody registered is an error.
// tests/deploy/test_helm.py renders the chart for several values files and runs this test
// with TIERPROXY_RENDERED naming the directory of the rendered manifests.
package helm

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// The API groups the chart may render; anything else is refused.
var decoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, policyv1.AddToScheme, monitoringv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}()

// documents splits a multi-document YAML stream, dropping documents with no object
// (helm template's comment-only ones).
func documents(stream io.Reader) ([][]byte, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(stream))
	var docs [][]byte
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(doc), "\n") {
			if trimmed := strings.TrimSpace(line); trimmed != "" && !strings.HasPrefix(trimmed, "#") && trimmed != "---" {
				docs = append(docs, doc)
				break
			}
		}
	}
}

// decode returns the object of one document, or why it is not one of the known types.
func decode(doc []byte) (runtime.Object, error) {
	object, _, err := decoder.Decode(doc, nil, nil)
	return object, err
}

func source(doc []byte) string {
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "# Source: ") {
			return strings.TrimPrefix(line, "# Source: ")
		}
	}
	return "(no # Source line)"
}

func TestRenderedObjectsDecodeStrictly(t *testing.T) {
	dir := os.Getenv("TIERPROXY_RENDERED")
	if dir == "" {
		t.Fatal("TIERPROXY_RENDERED must name the directory of rendered manifests (tests/deploy/test_helm.py sets it)")
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no rendered manifests in %s (%v)", dir, err)
	}
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := documents(bytes.NewReader(text))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(docs) == 0 {
			t.Errorf("%s: no object rendered", file)
		}
		for _, doc := range docs {
			if _, err := decode(doc); err != nil {
				t.Errorf("%s: %s: %v", filepath.Base(file), source(doc), err)
			}
		}
	}
}

const deployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: x
spec:
  %s: 2
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x}
    spec:
      containers:
        - name: x
          image: x
`

func TestStrictDecodingRefusesWhatIsNotTheType(t *testing.T) {
	good := strings.Replace(deployment, "%s", "replicas", 1)
	object, err := decode([]byte(good))
	if err != nil {
		t.Fatalf("a well-formed Deployment: %v", err)
	}
	if got := *object.(*appsv1.Deployment).Spec.Replicas; got != 2 {
		t.Fatalf("replicas decoded as %d", got)
	}
	for name, doc := range map[string]string{
		"a misspelled field":   strings.Replace(deployment, "%s", "replica", 1),
		"a duplicate field":    strings.Replace(deployment, "%s: 2", "replicas: 2\n  replicas: 3", 1),
		"an unregistered kind": "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: x\n",
		"a misspelled field of a PrometheusRule": "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\n" +
			"metadata:\n  name: x\nspec:\n  groups:\n    - name: g\n      rules:\n        - alert: A\n          exp: up == 0\n",
	} {
		if _, err := decode([]byte(doc)); err == nil {
			t.Errorf("%s was accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

func TestDocumentsSkipsCommentOnlyDocuments(t *testing.T) {
	docs, err := documents(strings.NewReader("---\n# Source: x\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"))
	if err != nil || len(docs) != 1 {
		t.Fatalf("got %d documents, %v", len(docs), err)
	}
}
