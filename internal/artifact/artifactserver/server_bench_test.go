package artifactserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pki"
)

// hundredFiles is a Program of 100 files of ~1.5 KiB each, spread over ten
// modules.
func hundredFiles() map[string]string {
	files := map[string]string{}
	for i := range 100 {
		var b strings.Builder
		for j := range 12 {
			fmt.Fprintf(&b, "resource \"terraform_data\" \"r%d_%d\" {\n  input = { index = %d, name = \"module-%d-resource-%d\" }\n}\n", i, j, i*100+j, i%10, j)
		}
		files[fmt.Sprintf("modules/m%d/file%03d.tf", i%10, i)] = b.String()
	}
	return files
}

// informerLikeReader answers like the manager's cache: a deep copy of the
// stored object, without the fake client's serialization round trip.
type informerLikeReader struct{ program *terracev1.Program }

func (r informerLikeReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	if key != client.ObjectKeyFromObject(r.program) {
		return apierrors.NewNotFound(terracev1.GroupVersion.WithResource("programs").GroupResource(), key.Name)
	}
	r.program.DeepCopyInto(obj.(*terracev1.Program))
	return nil
}

func (r informerLikeReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("not used by the server")
}

// BenchmarkServeProgram measures the served path of a 100-file Program:
// authorization, the Program read from the (cache-backed) reader, the
// tarball (from the LRU or built), and the response. "handler" runs the
// handler in-process; "tls" goes through a real loopback HTTPS connection
// with a runner certificate, kept alive between requests.
func BenchmarkServeProgram(b *testing.B) {
	p := newPeers(b)
	prog := testProgram("bench", "p", 1, hundredFiles())
	reader := informerLikeReader{prog}
	runner := pki.RunnerIdentity("bench", "stack", "run")
	data, digest, err := BuildProgram(prog)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("artifact: %d files, %d bytes compressed", len(prog.Spec.Files), len(data))

	for _, tc := range []struct {
		name       string
		cacheBytes int64
	}{{"handler/cached", DefaultCacheBytes}, {"handler/uncached", -1}} {
		b.Run(tc.name, func(b *testing.B) {
			srv := p.server(b, ServerOptions{CacheBytes: tc.cacheBytes}, reader, nil)
			h := srv.Handler()
			state := p.connectionState(b, runner)
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for range b.N {
				req := httptest.NewRequest(http.MethodGet, "/programs/bench/p/1.tar.gz", nil)
				req.TLS = state
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != 200 || rec.Body.Len() != len(data) {
					b.Fatalf("code %d", rec.Code)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
	for _, tc := range []struct {
		name       string
		cacheBytes int64
	}{{"tls/cached", DefaultCacheBytes}, {"tls/uncached", -1}} {
		b.Run(tc.name, func(b *testing.B) {
			_, base := startServer(b, p, reader, ServerOptions{CacheBytes: tc.cacheBytes})
			client := p.httpClient(b, runner)
			url := ProgramURL(base, "bench", "p", 1)
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for range b.N {
				resp, err := client.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != 200 || n != int64(len(data)) || resp.Header.Get("ETag") != `"`+digest+`"` {
					b.Fatalf("code %d, %d bytes", resp.StatusCode, n)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}
