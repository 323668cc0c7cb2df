package apiserver

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/pkg/client"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// TestTheGoClientSpeaksEveryProtocol: pkg/client, as another project would
// import it, in each protocol against the same port.
func TestTheGoClientSpeaksEveryProtocol(t *testing.T) {
	at := newAPITest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, protocol := range []client.Protocol{client.GRPC, client.GRPCWeb, client.Connect, client.ConnectJSON} {
		c, err := client.New(at.url, client.Options{Token: client.StaticToken(at.admin), HTTPClient: at.h2Client(), Protocol: protocol})
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("web-%d", i)
		if _, err := c.Create(ctx, connect.NewRequest(&apiv1.CreateRequest{Name: name, Source: &apiv1.Source{ProgramRef: "m"}})); err != nil {
			t.Fatalf("%s: create: %v", protocol, err)
		}
		got, err := c.Get(ctx, connect.NewRequest(&apiv1.GetRequest{Name: name}))
		if err != nil || got.Msg.Name != name {
			t.Fatalf("%s: get: %v %v", protocol, got, err)
		}
		_, err = c.Get(ctx, connect.NewRequest(&apiv1.GetRequest{Name: "gone"}))
		if client.Reason(err) != reasonNotFound {
			t.Fatalf("%s: reason of %v: %q", protocol, err, client.Reason(err))
		}
	}
	c, err := client.New(at.url, client.Options{Token: client.StaticToken(at.admin), HTTPClient: at.h2Client()})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		in, err := c.WaitFor(ctx, "", "web-0", client.Ready)
		if err == nil && !in.Ready {
			err = fmt.Errorf("WaitFor returned %v", in)
		}
		waited <- err
	}()
	// WaitFor returns only once the installation is Ready.
	select {
	case err := <-waited:
		t.Fatalf("WaitFor returned before Ready: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	at.setConditions("web-0", metav1.Condition{Type: terracev1.ReadyCondition, Status: metav1.ConditionTrue, Reason: "Applied", Message: "applied"})
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if _, err := client.New("http://insecure", client.Options{Token: client.StaticToken("x")}); err == nil {
		t.Fatal("a plain-HTTP URL was accepted")
	}
}
