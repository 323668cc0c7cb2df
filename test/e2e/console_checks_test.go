package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// liveLogModule prints a line computed by the shell (so the command tofu
// logs before running it does not hold it), then applies until the file
// var.release exists: the test decides when the run ends, no clock does.
const liveLogModule = `
variable "release" { type = string }
resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command = "echo console-live-$((6*7)); while [ ! -e ${var.release} ]; do sleep 0.1; done"
  }
}
`

// liveLogLine is what liveLogModule prints while it runs.
const liveLogLine = "console-live-42"

// watchFrozen is the Watch answer a frozen tab gets: the Connect streaming
// envelope of one WatchResponse, then the end of the stream.
func watchFrozen(installationJSON string) []byte {
	frame := func(flags byte, msg string) []byte {
		out := make([]byte, 5, 5+len(msg))
		out[0] = flags
		binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
		return append(out, msg...)
	}
	return append(frame(0, `{"installation":`+installationJSON+`}`), frame(2, `{}`)...)
}

// freezeWatch makes every Watch the tab starts from now on answer with the
// installation as installationJSON shows it, and nothing after, until
// thawWatch: the page keeps showing that state while the Stack moves on,
// as a page whose live updates lag would. The WatchAll of the list is not
// touched.
func (tb *tab) freezeWatch(installationJSON string) {
	tb.t.Helper()
	tb.mu.Lock()
	tb.frozen = watchFrozen(installationJSON)
	tb.mu.Unlock()
	tb.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/terrace.api.v1.InstallationService/Watch"}}})
		return err
	}))
}

func (tb *tab) thawWatch() {
	tb.t.Helper()
	tb.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, fetch.Disable, cdp.Empty{})
		return err
	}))
	tb.mu.Lock()
	tb.frozen = nil
	tb.mu.Unlock()
}

// answerFrozen fulfils a paused Watch with the frozen answer (listener
// goroutine).
func (tb *tab) answerFrozen(id fetch.RequestID) {
	tb.mu.Lock()
	body := tb.frozen
	tb.mu.Unlock()
	_, err := chromedp.Run(tb.ctx, func(ctx context.Context, t *chromedp.Target) (cdp.Empty, error) {
		if body == nil {
			return cdp.Call(ctx, t, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: id})
		}
		return cdp.Call(ctx, t, fetch.FulfillRequest, fetch.FulfillRequestParams{RequestID: id, ResponseCode: 200,
			ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/connect+json"}}, Body: body})
	})
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if err == nil && body != nil {
		tb.frozenAnswers++
	}
}

// streamWatch asks chromium to hand over the body of a streamed (Watch or
// WatchAll) response as it arrives, with what it buffered before
// (listener goroutine); EventDataReceived brings the rest.
func (tb *tab) streamWatch(id network.RequestID) {
	res, err := chromedp.Run(tb.ctx, func(ctx context.Context, t *chromedp.Target) (network.StreamResourceContentResult, error) {
		return cdp.Call(ctx, t, network.StreamResourceContent, network.StreamResourceContentParams{RequestID: id})
	})
	if err != nil {
		return // the stream ended or was aborted first: its body is among the finished ones
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.streams[id] = append(res.BufferedData, tb.streams[id]...)
}

// streamed returns what the tab's Watch and WatchAll streams have carried so far, by URL.
func (tb *tab) streamed() map[string]string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	out := map[string]string{}
	for id, body := range tb.streams {
		out[fmt.Sprintf("stream %s %s", id, tb.urls[id])] = string(body)
	}
	return out
}

// contrastScript measures every visible text of the page: the WCAG 2
// contrast ratio of its colour (with the opacity of its ancestors) against
// the background it is drawn on (the ancestors' background colours
// composited, over white when none is opaque). Disabled controls are
// exempt (WCAG 1.4.3). It returns how many texts it measured and the five
// worst.
const contrastScript = `(() => {
  const parse = (c) => { const m = /rgba?\(([^)]+)\)/.exec(c); if (!m) return null;
    const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const over = (top, under) => [0, 1, 2].map((i) => top[i] * top[3] + under[i] * (1 - top[3])).concat([1]);
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const background = (el) => { const layers = [];
    for (let e = el; e; e = e.parentElement) { const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; } }
    return layers.reverse().reduce((under, top) => over(top, under), [255, 255, 255, 1]); };
  const out = [];
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n; (n = walk.nextNode());) {
    const el = n.parentElement, text = n.textContent.trim();
    if (!text || !el || !el.getClientRects().length || el.closest('[disabled], .skip:not(:focus)')) continue;
    const s = getComputedStyle(el);
    if (s.visibility !== 'visible') continue;
    let opacity = 1;
    for (let e = el; e; e = e.parentElement) opacity *= Number(getComputedStyle(e).opacity);
    const bg = background(el), c = parse(s.color);
    const fg = over([c[0], c[1], c[2], c[3] * opacity], bg);
    const a = lum(fg), b = lum(bg);
    out.push({ text: text.slice(0, 40), ratio: Math.round((Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05) * 100) / 100, color: s.color,
      background: 'rgb(' + bg.slice(0, 3).map(Math.round).join(', ') + ')' });
  }
  out.sort((x, y) => x.ratio - y.ratio);
  return JSON.stringify({ count: out.length, worst: out.slice(0, 5) });
})()`

type contrastReport struct {
	Count int `json:"count"`
	Worst []struct {
		Text       string  `json:"text"`
		Ratio      float64 `json:"ratio"`
		Color      string  `json:"color"`
		Background string  `json:"background"`
	} `json:"worst"`
}

func (tb *tab) contrast() contrastReport {
	tb.t.Helper()
	var r contrastReport
	if err := json.Unmarshal([]byte(tb.eval(contrastScript)), &r); err != nil {
		tb.t.Fatalf("contrast: %v", err)
	}
	return r
}

// expectContrast fails when a text of the page, in light or dark, has a
// contrast ratio under 4.5:1 (WCAG 2 AA for body text). It first proves
// the measurement can fail: with the muted text colour set to a light
// grey (through the CSSOM, which the page's CSP allows) the light page
// must measure under 4.5:1.
func expectContrast(t *testing.T, tb *tab, page string) {
	t.Helper()
	tb.do(colorScheme("light"))
	tb.eval(`String(document.documentElement.style.setProperty('--muted', '#aaaaaa'))`)
	bad := tb.contrast()
	tb.eval(`String(document.documentElement.style.removeProperty('--muted'))`)
	if len(bad.Worst) == 0 || bad.Worst[0].Ratio >= 4.5 {
		t.Errorf("%s: with a light grey text colour the contrast check found nothing under 4.5:1 (%+v): it cannot fail", page, bad)
	}
	for _, scheme := range []string{"light", "dark"} {
		tb.do(colorScheme(scheme))
		r := tb.contrast()
		if r.Count < 5 {
			t.Errorf("%s (%s): only %d texts measured", page, scheme, r.Count)
		}
		for _, w := range r.Worst {
			if w.Ratio < 4.5 {
				t.Errorf("%s (%s): %q has contrast %.2f:1 (%s on %s), want at least 4.5:1", page, scheme, w.Text, w.Ratio, w.Color, w.Background)
			}
		}
		if len(r.Worst) > 0 {
			t.Logf("%s (%s): %d texts, lowest contrast %.2f:1 (%q)", page, scheme, r.Count, r.Worst[0].Ratio, r.Worst[0].Text)
		}
	}
	tb.do(colorScheme(""))
}

// focusedJS describes the focused element: #id, a link as a:<href>, else
// its tag and words.
const focusedJS = `(() => { const e = document.activeElement; if (!e || e === document.body) return '';
  if (e.id) return '#' + e.id;
  if (e.tagName === 'A') return 'a:' + e.getAttribute('href');
  return e.tagName.toLowerCase() + ':' + e.textContent.trim().slice(0, 30); })()`

// maxTabs bounds the Tab presses of one search: the list may hold the
// Stacks of other tests' namespaces too.
const maxTabs = 250

// expectTabReaches presses Tab from the top of the page until every one of
// want (as focusedJS describes it) has had the focus, and fails naming the
// ones Tab never reached within maxTabs presses.
func expectTabReaches(t *testing.T, tb *tab, want ...string) {
	t.Helper()
	tb.eval(`String(document.activeElement && document.activeElement.blur())`)
	missing := map[string]bool{}
	for _, w := range want {
		missing[w] = true
	}
	var order []string
	for i := 0; i < maxTabs && len(missing) > 0; i++ {
		tb.do(chromedp.KeyEvent("\t"))
		f := tb.eval(focusedJS)
		order = append(order, f)
		delete(missing, f)
	}
	if len(missing) > 0 {
		t.Errorf("Tab never reached %v; it went %s", keys(missing), strings.Join(order, " → "))
	}
}

// tabToAndPress presses Tab until focused is what focusedJS says, then key.
func tabToAndPress(t *testing.T, tb *tab, focused, key string) {
	t.Helper()
	tb.eval(`String(document.activeElement && document.activeElement.blur())`)
	for i := 0; i < maxTabs; i++ {
		tb.do(chromedp.KeyEvent("\t"))
		if tb.eval(focusedJS) == focused {
			tb.do(chromedp.KeyEvent(key))
			return
		}
	}
	t.Fatalf("Tab never reached %s", focused)
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// allowListingStacksEverywhere lets the test namespace's ServiceAccount
// name list and watch Stacks in every namespace, as a platform team's
// viewers would, so the console lists all namespaces.
func (e *stackEnv) allowListingStacksEverywhere(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "console-list-" + e.ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{terracev1.GroupVersion.Group}, Resources: []string{"stacks"}, Verbs: []string{"list", "watch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: e.ns}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := e.c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.c.Delete(context.Background(), obj) })
	}
}

// grantIn binds the test namespace's ServiceAccount name to rules in namespace ns.
func (e *stackEnv) grantIn(t *testing.T, ns, name string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name + "-from-" + e.ns, Namespace: ns}, Rules: rules}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: e.ns}},
	}
	for _, obj := range []client.Object{role, rb} {
		if err := e.c.Create(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
	}
}

// stackIn reads Stack name of namespace ns.
func (e *stackEnv) stackIn(t *testing.T, ns, name string) *terracev1.Stack {
	t.Helper()
	var s terracev1.Stack
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}
