package e2e

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/terrace-dev/terrace/internal/testenv"
)

// browser is Debian's chromium, headless, started fresh for one test
// (hack/install-deps.sh installs it for `make test`). The network here is
// closed: without the flags that stop its background connections it hangs.
type browser struct {
	t    *testing.T
	root context.Context
}

// newBrowser starts chromium resolving host to ip and trusting exactly the
// serving key spki (base64 SHA-256 of the certificate's public key), so the
// TLS handshake is real and checked against that key.
func newBrowser(t *testing.T, host, ip, spki string) *browser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed: run hack/install-deps.sh test (%v)", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("host-resolver-rules", "MAP "+host+" "+ip),
		chromedp.Flag("ignore-certificate-errors-spki-list", spki),
		chromedp.WindowSize(1280, 900),
	}
	alloc, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	// One browser; each tab is a new target in it. Its first run starts
	// it and lives as long as its context: no timeout there.
	root, stop := chromedp.NewContext(alloc)
	t.Cleanup(stop)
	if err := chromedp.Do(root, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("failed to start chromium: %v", err)
	}
	return &browser{t: t, root: root}
}

// tab is one browser tab (its own sessionStorage) that records every
// response it receives, to search their bodies later, streamed ones as
// they arrive; it answers Watch itself while frozen (freezeWatch).
type tab struct {
	t   *testing.T
	ctx context.Context

	mu       sync.Mutex
	finished []network.RequestID
	urls     map[network.RequestID]string
	// streams are the bodies of Watch and WatchAll responses so far.
	streams map[network.RequestID][]byte
	// frozen, when set, is the answer to every Watch; frozenAnswers counts them.
	frozen        []byte
	frozenAnswers int
}

func (b *browser) tab() *tab {
	b.t.Helper()
	tb := &tab{t: b.t, urls: map[network.RequestID]string{}, streams: map[network.RequestID][]byte{}}
	ctx, cancel := chromedp.NewContext(b.root, chromedp.WithListener(func(ev any) {
		tb.mu.Lock()
		defer tb.mu.Unlock()
		switch e := ev.(type) {
		case *network.EventResponseReceived:
			tb.urls[e.RequestID] = e.Response.URL
			if strings.Contains(e.Response.URL, "InstallationService/Watch") {
				// Commands wait for the event loop this listener runs on.
				go tb.streamWatch(e.RequestID)
			}
		case *network.EventDataReceived:
			if len(e.Data) > 0 {
				tb.streams[e.RequestID] = append(tb.streams[e.RequestID], e.Data...)
			}
		case *network.EventLoadingFinished:
			tb.finished = append(tb.finished, e.RequestID)
		case *fetch.EventRequestPaused:
			go tb.answerFrozen(e.RequestID)
		}
	}))
	b.t.Cleanup(cancel)
	tb.ctx = ctx
	// The first run starts the tab and lives as long as its context: no timeout here.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		b.t.Fatalf("failed to open a tab: %v", err)
	}
	return tb
}

// do runs steps, failing the test with what the page showed when one fails.
func (tb *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 4*time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		text, _ := chromedp.Run(tb.ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		tb.t.Fatalf("browser: %v; the page shows:\n%s", err, text)
	}
}

func (tb *tab) eval(expression string) string {
	tb.t.Helper()
	v, err := chromedp.Run(tb.ctx, chromedp.Evaluate[string](expression, chromedp.EvalAwaitPromise))
	if err != nil {
		tb.t.Fatalf("browser: %s: %v", expression, err)
	}
	return v
}

func (tb *tab) text(selector string) string {
	tb.t.Helper()
	v, err := chromedp.Run(tb.ctx, chromedp.TextContent(chromedp.CSS(selector)))
	if err != nil {
		tb.t.Fatalf("browser: text of %s: %v", selector, err)
	}
	return v
}

// waitFor polls a JavaScript condition (no fixed sleeps).
func waitFor(expression string, timeout time.Duration) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expression, chromedp.WithPollingTimeout(timeout), chromedp.WithPollingInterval(200*time.Millisecond))
}

// bodies returns the bodies of every response the tab has finished
// receiving, by URL.
func (tb *tab) bodies() map[string]string {
	tb.t.Helper()
	tb.mu.Lock()
	ids := append([]network.RequestID(nil), tb.finished...)
	tb.mu.Unlock()
	out := map[string]string{}
	for i, id := range ids {
		res, err := chromedp.Run(tb.ctx, func(ctx context.Context, t *chromedp.Target) (network.GetResponseBodyResult, error) {
			return cdp.Call(ctx, t, network.GetResponseBody, network.GetResponseBodyParams{RequestID: id})
		})
		if err != nil {
			continue // evicted, or a redirect without a body
		}
		body := string(res.Body)
		if res.Base64encoded {
			raw, _ := base64.StdEncoding.DecodeString(body)
			body = string(raw)
		}
		tb.mu.Lock()
		out[fmt.Sprintf("%d %s", i, tb.urls[id])] = body
		tb.mu.Unlock()
	}
	return out
}

// colorScheme makes the page render as the system's light or dark preference would.
func colorScheme(scheme string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}},
		})
		return err
	})
}

// viewport sets the page's size; mobile emulates a phone.
func viewport(width, height int64, mobile bool) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{Width: width, Height: height, DeviceScaleFactor: 1, Mobile: mobile})
		return err
	})
}

// screenshots saves the page in light and dark as console-<name>-{light,dark}.png: into docs/images
// when TERRACE_CONSOLE_SCREENSHOTS=docs (make console-screenshots), else into the test's temporary
// directory, so that make test leaves the checkout as it found it.
func (tb *tab) screenshots(name string) {
	tb.t.Helper()
	dir := tb.t.TempDir()
	if os.Getenv("TERRACE_CONSOLE_SCREENSHOTS") == "docs" {
		dir = filepath.Join(testenv.RepoRoot(), "docs", "images")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.t.Fatal(err)
	}
	for _, scheme := range []string{"light", "dark"} {
		tb.do(colorScheme(scheme))
		png, err := chromedp.Run(tb.ctx, chromedp.FullScreenshot(100))
		if err != nil {
			tb.t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, "console-"+name+"-"+scheme+".png"), png, 0o644); err != nil {
			tb.t.Fatal(err)
		}
	}
	tb.do(colorScheme(""))
}

// spkiOf is chromium's pin of a PEM certificate: base64 SHA-256 of its public key.
func spkiOf(t *testing.T, certPEM []byte) string {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`).Replace(s) + "'"
}
