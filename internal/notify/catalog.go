package notify

import (
	"fmt"
	"slices"
	"strings"

	"github.com/argoproj/notifications-engine/pkg/api"
	"github.com/argoproj/notifications-engine/pkg/services"
	"github.com/argoproj/notifications-engine/pkg/triggers"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The built-in triggers, conditions over a Stack's status in expr
// (github.com/expr-lang/expr) with the variables of stackVars. A trigger or
// template of the same name in the ConfigMap replaces the built-in one.
// oncePer makes a trigger fire once per plan, release or drift, not once
// per condition change.
var defaultTriggers = map[string][]triggers.Condition{
	"on-plan-pending": {{
		Description: "a plan waits for approval",
		When:        `(stack.status.plan?.pending ?? "") != ""`,
		OncePer:     `stack.status.plan.pending`,
		Send:        []string{"plan-pending"},
	}},
	"on-applied": {{
		Description: "a plan was applied: a new release",
		When:        `conditions.Applied?.status == "True" && (stack.status.release?.revision ?? 0) > 0`,
		OncePer:     `stack.status.release.revision`,
		Send:        []string{"applied"},
	}},
	"on-failed": {{
		Description: "a run failed (retried), or the Stack is stalled until its spec changes",
		When:        `conditions.Ready?.status == "False" && (conditions.Stalled?.status == "True" || (stack.status.failures ?? 0) > 0)`,
		Send:        []string{"failed"},
	}},
	"on-drift": {{
		Description: "resources were changed outside Terrace",
		When:        `conditions.Drifted?.status == "True"`,
		OncePer:     `stack.status.lastDriftDetectedAt`,
		Send:        []string{"drift"},
	}},
}

// defaultTriggerNames are the triggers of a subscription that names none
// (notifications.terrace.dev/subscribe.<service>), unless the ConfigMap's
// defaultTriggers says otherwise.
var defaultTriggerNames = []string{"on-plan-pending", "on-applied", "on-failed", "on-drift"}

// defaultTemplates are the built-in templates: a sprig expression for the
// human text (the message of Slack, Teams and others, "text" of a webhook's
// JSON body), by template name.
var defaultTemplates = map[string]string{
	"plan-pending": `printf "Stack %s/%s: plan %s (%s) of %s awaits approval; set spec.approvePlan to %s to apply it" .stack.metadata.namespace .stack.metadata.name .plan .summary .revision .plan`,
	"applied":      `printf "Stack %s/%s: %s" .stack.metadata.namespace .stack.metadata.name .message`,
	"failed":       `printf "Stack %s/%s failed (%s): %s" .stack.metadata.namespace .stack.metadata.name .reason .message`,
	"drift":        `printf "Stack %s/%s: %s" .stack.metadata.namespace .stack.metadata.name .conditions.Drifted.message`,
}

// webhookBody is the JSON body the built-in templates give each webhook
// service: the event, its text, and the facts a receiver acts on.
const webhookBody = `{"event": %q, "text": {{ %s | toJson }}, "namespace": {{ toJson .stack.metadata.namespace }}, "name": {{ toJson .stack.metadata.name }}, ` +
	`"revision": {{ toJson .revision }}, "plan": {{ toJson .plan }}, "summary": {{ toJson .summary }}, "reason": {{ toJson .reason }}, "message": {{ toJson .message }}}`

// addDefaults completes cfg, parsed from the ConfigMap cm, with the
// built-in triggers and templates it does not replace; a built-in
// template sends JSON (POST) to every webhook service of cm.
func addDefaults(cfg *api.Config, cm *corev1.ConfigMap) {
	for name, t := range defaultTriggers {
		if _, ok := cfg.Triggers[name]; !ok {
			cfg.Triggers[name] = t
		}
	}
	var webhooks []string
	for key := range cm.Data {
		if name, ok := strings.CutPrefix(key, "service.webhook."); ok {
			webhooks = append(webhooks, name)
		} else if key == "service.webhook" {
			webhooks = append(webhooks, "webhook")
		}
	}
	slices.Sort(webhooks)
	for name, text := range defaultTemplates {
		if _, ok := cfg.Templates[name]; ok {
			continue
		}
		n := services.Notification{Message: "{{ " + text + " }}"}
		for _, w := range webhooks {
			if n.Webhook == nil {
				n.Webhook = services.WebhookNotifications{}
			}
			n.Webhook[w] = services.WebhookNotification{Method: "POST", Body: fmt.Sprintf(webhookBody, name, text)}
		}
		cfg.Templates[name] = n
	}
	if len(cfg.DefaultTriggers) == 0 {
		cfg.DefaultTriggers = defaultTriggerNames
	}
}

// stackVars are what triggers and templates see of a Stack: the object as
// stack, its conditions by type (conditions.Ready.status), and, ready to
// print, the revision it works on, the pending (else last) plan with its
// summary, and the Ready condition's reason and message. Nothing from the
// Secret: templates never see credentials.
func stackVars(obj map[string]any) map[string]any {
	conditions := map[string]any{}
	list, _, _ := unstructured.NestedSlice(obj, "status", "conditions")
	for _, c := range list {
		if m, ok := c.(map[string]any); ok {
			if t, ok := m["type"].(string); ok {
				conditions[t] = m
			}
		}
	}
	str := func(fields ...string) string {
		v, _, _ := unstructured.NestedString(obj, fields...)
		return v
	}
	revision := str("status", "lastAttemptedRevision")
	if revision == "" {
		revision = str("status", "lastAppliedRevision")
	}
	plan := str("status", "plan", "pending")
	if plan == "" {
		plan = str("status", "plan", "id")
	}
	count := func(field string) int64 {
		v, _, _ := unstructured.NestedInt64(obj, "status", "plan", field)
		return v
	}
	summary := ""
	if plan != "" {
		summary = fmt.Sprintf("+%d ~%d -%d", count("add"), count("change"), count("destroy"))
	}
	reason, message := "", ""
	if ready, ok := conditions["Ready"].(map[string]any); ok {
		reason, _ = ready["reason"].(string)
		message, _ = ready["message"].(string)
	}
	return map[string]any{
		"stack":      obj,
		"conditions": conditions,
		"revision":   revision,
		"plan":       plan,
		"summary":    summary,
		"reason":     reason,
		"message":    message,
	}
}
