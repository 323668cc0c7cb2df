package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/config"
)

// consoleModule greets, and keeps a password the plan and outputs must mask.
const consoleModule = `
variable "greeting" {
  type        = string
  description = "What the Stack says"
}
variable "password" {
  type      = string
  sensitive = true
  default   = "unused"
}
resource "terraform_data" "hello" { input = var.greeting }
resource "terraform_data" "secret" { input = var.password }
output "greeting" { value = terraform_data.hello.output }
output "password" {
  value     = var.password
  sensitive = true
}
`

// TestConsoleInABrowser drives the web console that `terrace api` serves
// with headless chromium: sign-in with a ServiceAccount token; the list
// shows every Stack (a Ready one made with kubectl, a waiting
// installation, and a suspended Stack of another namespace); the waiting
// one's plan is read, a stale plan id is refused with a message, and the
// pending one approved until the page shows release 2 with no reload; the
// live log of a running run; Reconcile, Suspend and Resume clicks change
// the Stacks, the last two in the other namespace; a user without update
// rights sees Approve disabled and is refused when asking directly; a
// wrong token is told so; a planted secret is never in the page, the
// responses (finished or streamed) or the browser's storage; text contrast
// is measured in light and dark, and the controls are reached by Tab. It
// writes the screenshots of docs/console.md.
func TestConsoleInABrowser(t *testing.T) {
	e := newStackEnv(t)
	podIP := e.enableAPI(t)
	planted := fmt.Sprintf("planted-secret-%d", time.Now().UnixNano())
	e.program(t, "hello", map[string]string{"main.tf": consoleModule})
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db"}, StringData: map[string]string{"password": planted}})
	e.allowRunnerToRead(t, "db")
	// ready is made as with kubectl (no installation label); web as through the API.
	e.create(t, consoleStack("ready", false))
	e.create(t, consoleStack("web", true))
	e.waitStack(t, "ready", stackTimeout, "applied", readyAt)
	e.waitStack(t, "web", stackTimeout, "applied", readyAt)
	// web now waits for approval of a change.
	e.updateStack(t, "web", func(s *terracev1.Stack) {
		s.Spec.ApprovePlan = ""
		s.Spec.Vars["greeting"] = apiextensionsv1.JSON{Raw: []byte(`"hello again"`)}
	})
	planID := e.waitStack(t, "web", stackTimeout, "a plan waiting for approval", pendingPlan("")).Status.Plan.Pending
	// Another namespace's Stack, suspended, that the operator may change there.
	other := testNamespace(t, e.cs)
	elsewhere := consoleStack("elsewhere", false)
	elsewhere.Namespace, elsewhere.Spec.Suspend = other, true
	if err := e.c.Create(context.Background(), elsewhere); err != nil {
		t.Fatal(err)
	}

	admin := e.toolToken(t, "operator")
	e.grant(t, "operator", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods", "pods/log"}, Verbs: []string{"get", "list"}},
		rbacv1.PolicyRule{APIGroups: []string{terracev1.GroupVersion.Group}, Resources: []string{"programs"}, Verbs: []string{"get"}})
	e.allowListingStacksEverywhere(t, "operator")
	e.grantIn(t, other, "operator", rbacv1.PolicyRule{APIGroups: []string{terracev1.GroupVersion.Group}, Resources: []string{"stacks"}, Verbs: []string{"get", "list", "watch", "patch"}})
	viewer := e.toolTokenWithoutRights(t, "viewer")
	e.grant(t, "viewer", rbacv1.PolicyRule{APIGroups: []string{terracev1.GroupVersion.Group}, Resources: []string{"stacks"}, Verbs: []string{"get", "list", "watch"}})

	var tlsSecret corev1.Secret
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: config.APITLSSecretName}, &tlsSecret); err != nil {
		t.Fatal(err)
	}
	host := config.APIName + "." + e.ns + ".svc"
	base := fmt.Sprintf("https://%s:%d/", host, config.APIPort)
	b := newBrowser(t, host, podIP, spkiOf(t, tlsSecret.Data["tls.crt"]))
	row := func(ns, name string) string { return fmt.Sprintf(`tr[data-namespace=%q][data-name=%q]`, ns, name) }
	page := func(ns, name string) string { return base + "#/stack/" + ns + "/" + name }

	t.Run("wrong token", func(t *testing.T) {
		tb := b.tab()
		tb.do(chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#token")))
		tb.screenshots("sign-in")
		expectLabelled(t, tb)
		expectContrast(t, tb, "sign-in")
		// With the keyboard alone: the field has the focus, Tab reaches Sign in, Enter presses it.
		tb.do(chromedp.KeyEvent("not-a-token"), chromedp.KeyEvent("\t"), chromedp.KeyEvent("\r"),
			chromedp.WaitVisible(chromedp.CSS("#sign-in-error .error")))
		if msg := tb.text("#sign-in-error"); !strings.Contains(msg, "Sign-in failed") || !strings.Contains(msg, "not accepted") {
			t.Errorf("error shown for a wrong token: %q", msg)
		}
		if stored := tb.eval(`JSON.stringify(Object.keys(sessionStorage))`); stored != "[]" {
			t.Errorf("a refused token was kept: %s", stored)
		}
	})

	t.Run("no update rights", func(t *testing.T) {
		tb := b.tab()
		signIn(tb, base, viewer)
		tb.do(chromedp.Navigate(page(e.ns, "web")), chromedp.WaitVisible(chromedp.CSS("#approve")))
		if disabled := tb.eval(`String(document.querySelector('#approve').disabled)`); disabled != "true" {
			t.Errorf("Approve is enabled for a user who may not update Stacks")
		}
		// Asked directly, with the same token, the API refuses.
		answer := tb.eval(`fetch('/terrace.api.v1.InstallationService/ApprovePlan', {method: 'POST',
			headers: {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + sessionStorage.getItem('terrace.token')},
			body: JSON.stringify({namespace: ` + jsString(e.ns) + `, name: 'web', planId: ` + jsString(planID) + `})}).then(async r => r.status + ' ' + (await r.json()).code)`)
		if answer != "403 permission_denied" {
			t.Errorf("a direct approval by a user without rights answered %q, want 403 permission_denied", answer)
		}
		if s := e.getStack(t, "web"); s.Spec.ApprovePlan != "" {
			t.Errorf("the refused approval changed the Stack: approvePlan %q", s.Spec.ApprovePlan)
		}
		expectNoSecret(t, tb, planted)
	})

	greeting := "hello again"
	t.Run("stale plan", func(t *testing.T) {
		tb := b.tab()
		signIn(tb, base, admin)
		tb.do(chromedp.Navigate(page(e.ns, "web")), waitFor(`document.querySelector('#approve')?.dataset.plan === `+jsString(planID), time.Minute))
		// The page keeps showing plan planID while the Stack plans again.
		shown := tb.eval(`fetch('/terrace.api.v1.InstallationService/Get', {method: 'POST', headers: {'Content-Type': 'application/json',
			'Authorization': 'Bearer ' + sessionStorage.getItem('terrace.token')}, body: JSON.stringify({namespace: ` + jsString(e.ns) + `, name: 'web'})}).then(r => r.text())`)
		tb.freezeWatch(shown)
		tb.do(chromedp.Navigate(base+"#/"), chromedp.WaitVisible(chromedp.CSS("#stacks")), chromedp.Navigate(page(e.ns, "web")),
			waitFor(`document.querySelector('#approve')?.dataset.plan === `+jsString(planID)+` && !document.querySelector('#approve').disabled`, time.Minute))
		eventually(t, time.Minute, "the page's Watch answered from the frozen state", func() error {
			tb.mu.Lock()
			defer tb.mu.Unlock()
			if tb.frozenAnswers == 0 {
				return fmt.Errorf("no Watch answered yet")
			}
			return nil
		})
		greeting = "hello once more"
		e.updateStack(t, "web", func(s *terracev1.Stack) {
			s.Spec.Vars["greeting"] = apiextensionsv1.JSON{Raw: []byte(strconv.Quote(greeting))}
		})
		newID := e.waitStack(t, "web", stackTimeout, "a new plan waiting for approval", pendingPlan(planID)).Status.Plan.Pending
		tb.do(chromedp.Click(chromedp.CSS("#approve")), chromedp.WaitVisible(chromedp.CSS("#action-result .error")))
		if msg := tb.text("#action-result"); !strings.Contains(msg, "Refused") || !strings.Contains(msg, planID) || !strings.Contains(msg, "not the pending plan") || !strings.Contains(msg, newID) {
			t.Errorf("a stale approval shows %q, want it refused naming %s and the pending %s", msg, planID, newID)
		}
		if s := e.getStack(t, "web"); s.Spec.ApprovePlan != "" {
			t.Errorf("the stale approval changed the Stack: approvePlan %q", s.Spec.ApprovePlan)
		}
		// Live again: the page shows the new plan.
		tb.thawWatch()
		tb.do(waitFor(`document.querySelector('#approve')?.dataset.plan === `+jsString(newID), time.Minute))
		planID = newID
		expectTabReaches(t, tb, "#reconcile", "#suspend", "#approve", "#plan-text", "#sign-out", "a:#/", "a:#/install")
		expectNoSecret(t, tb, planted)
	})

	t.Run("approve", func(t *testing.T) {
		tb := b.tab()
		signIn(tb, base, admin)
		tb.do(waitFor(`document.querySelector('`+row(e.ns, "ready")+` [data-phase="Ready"]') && document.querySelector('`+row(e.ns, "web")+` [data-phase="AwaitingApproval"]') && document.querySelector('`+row(other, "elsewhere")+`')`, time.Minute))
		// Every Stack: the installation is marked, the others are not.
		if marks := tb.eval(`[` + jsString(row(e.ns, "ready")) + `, ` + jsString(row(e.ns, "web")) + `, ` + jsString(row(other, "elsewhere")) + `].map(s => document.querySelector(s).dataset.installation).join()`); marks != "false,true,false" {
			t.Errorf("installation marks of ready, web, elsewhere: %s", marks)
		}
		tb.screenshots("stacks")
		expectLabelled(t, tb)
		expectContrast(t, tb, "stacks")
		expectTabReaches(t, tb, "#filter-namespace", "#filter-status", "#filter-label", "a:#/stack/"+e.ns+"/web", "a:#/stack/"+other+"/elsewhere")
		// Opened by the keyboard.
		tabToAndPress(t, tb, "a:#/stack/"+e.ns+"/web", "\r")
		tb.do(chromedp.WaitVisible(chromedp.CSS("#plan-text")), waitFor(`document.querySelector('#releases tr[data-revision="1"]')`, time.Minute))
		plan := tb.text("#plan-text")
		if !strings.Contains(plan, "terraform_data.hello") || !strings.Contains(plan, greeting) {
			t.Errorf("the plan shown does not describe the change to %q:\n%s", greeting, plan)
		}
		if got := tb.eval(`document.querySelector('#approve').dataset.plan`); got != planID {
			t.Errorf("Approve is for plan %q, want the pending %q", got, planID)
		}
		tb.screenshots("stack")
		expectLabelled(t, tb)
		expectContrast(t, tb, "stack")
		// A marker that a reload would lose.
		tb.eval(`String(window.notReloaded = true)`)
		tb.do(chromedp.Click(chromedp.CSS("#approve")),
			waitFor(`document.querySelector('#release')?.textContent === '2' && document.querySelector('#phase [data-phase]')?.dataset.phase === 'Ready' && document.querySelector('#releases tr[data-revision="2"]')`, stackTimeout),
			// The page reloads releases and outputs with two calls when the
			// release moves; the outputs' answer may come second.
			waitFor(`document.querySelector('#outputs')?.textContent.includes(`+strconv.Quote(greeting)+`)`, stackTimeout))
		if tb.eval(`String(window.notReloaded === true)`) != "true" {
			t.Error("the page was reloaded")
		}
		if s := e.getStack(t, "web"); s.Status.Release == nil || s.Status.Release.Revision != 2 {
			t.Errorf("Stack web: release %+v, want revision 2", s.Status.Release)
		}
		if masked := tb.text("#outputs"); !strings.Contains(masked, "(sensitive, hidden)") || !strings.Contains(masked, greeting) {
			t.Errorf("outputs shown: %q", masked)
		}
		tb.do(chromedp.Navigate(base+"#/install"), chromedp.WaitVisible(chromedp.CSS("#i-program")),
			chromedp.SetValue(chromedp.CSS("#i-program"), "hello"), chromedp.Click(chromedp.CSS("#i-load")), chromedp.WaitVisible(chromedp.CSS("#v-greeting")))
		if hint := tb.text("#i-vars"); !strings.Contains(hint, "What the Stack says") || strings.Contains(hint, "unused") {
			t.Errorf("install form: %q (want the description, and no sensitive default)", hint)
		}
		tb.screenshots("install")
		expectLabelled(t, tb)
		expectContrast(t, tb, "install")
		tb.do(viewport(390, 844, true), chromedp.Navigate(base+"#/"), waitFor(`document.querySelector('`+row(e.ns, "web")+`')`, time.Minute))
		tb.screenshots("stacks-phone")
		expectNoSecret(t, tb, planted)
		// Sign-out clears the tab's storage.
		tb.do(chromedp.Click(chromedp.CSS("#sign-out")), chromedp.WaitVisible(chromedp.CSS("#token")))
		if stored := tb.eval(`String(sessionStorage.length + localStorage.length)`); stored != "0" {
			t.Errorf("after sign-out the browser still stores %s items", stored)
		}
	})

	t.Run("live log", func(t *testing.T) {
		release := filepath.Join(e.runnerDir(t), "release")
		e.program(t, "slow", map[string]string{"main.tf": liveLogModule})
		slow := withRunnerDir(&terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "slow"}, Spec: terracev1.StackSpec{
			Source:      terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "slow"}},
			Vars:        map[string]apiextensionsv1.JSON{"release": {Raw: []byte(strconv.Quote(release))}},
			ApprovePlan: terracev1.ApprovePlanAuto,
		}}, filepath.Dir(release))
		e.create(t, slow)
		tb := b.tab()
		signIn(tb, base, admin)
		tb.do(chromedp.Navigate(page(e.ns, "slow")),
			waitFor(`document.querySelector('#log-text')?.textContent.includes(`+jsString(liveLogLine)+`) && document.querySelector('#h-log').textContent.includes('(running)')`, stackTimeout))
		if phase := tb.eval(`document.querySelector('#phase [data-phase]').dataset.phase`); phase == "Ready" {
			t.Errorf("the run's log was shown only once it was over (phase %s)", phase)
		}
		if err := os.WriteFile(release, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		tb.do(waitFor(`document.querySelector('#phase [data-phase]')?.dataset.phase === 'Ready' && !document.querySelector('#h-log').textContent.includes('(running)')`, stackTimeout))
		expectNoSecret(t, tb, planted)
	})

	t.Run("actions", func(t *testing.T) {
		tb := b.tab()
		signIn(tb, base, admin)
		tb.do(chromedp.Navigate(page(e.ns, "ready")), chromedp.WaitVisible(chromedp.CSS("#reconcile:enabled")))
		tb.do(chromedp.Click(chromedp.CSS("#reconcile")), waitFor(`document.querySelector('#notice').textContent.includes('Reconcile requested')`, time.Minute))
		requested := e.getStack(t, "ready").Annotations[terracev1.ReconcileRequestAnnotation]
		if requested == "" {
			t.Fatal("the Reconcile click set no terrace.dev/requestedAt")
		}
		e.waitStack(t, "ready", stackTimeout, "the requested reconcile handled", func(s *terracev1.Stack) error {
			if s.Status.LastHandledReconcileAt != requested {
				return fmt.Errorf("lastHandledReconcileAt %q, requested %q", s.Status.LastHandledReconcileAt, requested)
			}
			return nil
		})
		// In the other namespace: Resume, then Suspend.
		tb.do(chromedp.Navigate(page(other, "elsewhere")), chromedp.WaitVisible(chromedp.CSS("#resume:enabled")))
		if ns := tb.text("h1"); !strings.Contains(ns, other) {
			t.Errorf("the page of a Stack of %s is titled %q", other, ns)
		}
		suspended := func(want bool) func() error {
			return func() error {
				if got := e.stackIn(t, other, "elsewhere").Spec.Suspend; got != want {
					return fmt.Errorf("spec.suspend is %v; the page says %q", got, tb.eval(`document.querySelector('#action-result').textContent + ' ' + document.querySelector('#notice').textContent`))
				}
				return nil
			}
		}
		tb.do(chromedp.Click(chromedp.CSS("#resume")))
		eventually(t, time.Minute, "the Stack resumed by the click", suspended(false))
		tb.do(chromedp.WaitVisible(chromedp.CSS("#suspend:enabled")), chromedp.Click(chromedp.CSS("#suspend")))
		eventually(t, time.Minute, "the Stack suspended by the click", suspended(true))
		tb.do(chromedp.WaitVisible(chromedp.CSS("#resume:enabled")))
		expectNoSecret(t, tb, planted)
	})
}

// pendingPlan accepts a Stack with a pending plan other than not.
func pendingPlan(not string) func(*terracev1.Stack) error {
	return func(s *terracev1.Stack) error {
		if s.Status.Plan == nil || s.Status.Plan.Pending == "" || s.Status.Plan.Pending == not {
			return fmt.Errorf("no new pending plan")
		}
		return nil
	}
}

// consoleStack is a Stack of the hello Program; installation labels it as
// one made through the Installations API.
func consoleStack(name string, installation bool) *terracev1.Stack {
	labels := map[string]string{"team": "platform"}
	if installation {
		labels["terrace.dev/installation"] = "true"
	}
	return &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: terracev1.StackSpec{
			Source:            terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "hello"}},
			Vars:              map[string]apiextensionsv1.JSON{"greeting": {Raw: []byte(`"hi"`)}},
			VarsFrom:          []terracev1.VarsReference{{Kind: "Secret", Name: "db"}},
			ApprovePlan:       terracev1.ApprovePlanAuto,
			StoreReadablePlan: terracev1.ReadablePlanHuman,
		},
	}
}

// signIn pastes token into the sign-in form and waits for the Stacks page.
func signIn(tb *tab, base, token string) {
	tb.t.Helper()
	tb.do(chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SetValue(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#sign-in button[type=submit]")),
		chromedp.WaitVisible(chromedp.CSS("#stacks")))
}

// expectNoSecret fails if the secret is in the page, a response the tab
// received, or the browser's storage.
func expectNoSecret(t *testing.T, tb *tab, secret string) {
	t.Helper()
	if html := tb.eval(`document.documentElement.outerHTML`); strings.Contains(html, secret) {
		t.Error("the planted secret is in the page's HTML")
	}
	if stored := tb.eval(`JSON.stringify({...sessionStorage}) + JSON.stringify({...localStorage}) + document.cookie`); strings.Contains(stored, secret) {
		t.Error("the planted secret is in the browser's storage")
	}
	bodies := tb.bodies()
	if len(bodies) < 3 {
		t.Errorf("only %d response bodies were recorded: the search would prove nothing", len(bodies))
	}
	for url, body := range bodies {
		if strings.Contains(body, secret) {
			t.Errorf("the planted secret is in the response of %s", url)
		}
	}
	// Watch and WatchAll, as they streamed: a stream still open has no
	// finished body to search.
	streams := tb.streamed()
	var events int
	for url, body := range streams {
		events += strings.Count(body, `"installation"`)
		if strings.Contains(body, secret) {
			t.Errorf("the planted secret is in the streamed response of %s", url)
		}
	}
	if events == 0 {
		t.Errorf("no streamed event was recorded (%d streams): the search of streams would prove nothing", len(streams))
	}
}

// expectLabelled fails for a visible form control without a label, or a
// button or link without words: what a screen reader could not name.
func expectLabelled(t *testing.T, tb *tab) {
	t.Helper()
	unnamed := tb.eval(`JSON.stringify([...document.querySelectorAll('input, select, textarea, button, a')]
		.filter(e => e.offsetParent !== null)
		.filter(e => (e.matches('input, select, textarea') ? (e.labels.length === 0 && !e.getAttribute('aria-label')) : e.textContent.trim() === ''))
		.map(e => e.outerHTML.slice(0, 80)))`)
	if unnamed != "[]" {
		t.Errorf("controls without a name: %s", unnamed)
	}
}

// grant adds rules to the ServiceAccount name of the test's namespace.
func (e *stackEnv) grant(t *testing.T, name string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name + "-extra", Namespace: e.ns}, Rules: rules}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-extra", Namespace: e.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: e.ns}},
	}
	for _, obj := range []client.Object{role, rb} {
		if err := e.c.Create(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
	}
}
