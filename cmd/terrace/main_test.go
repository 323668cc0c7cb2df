package main

import "testing"

// An image built without terrace-runner links it to terrace: started under
// that name, terrace is the runner, flags and all.
func TestStartedAsTerraceRunnerTheBinaryIsTheRunner(t *testing.T) {
	runner := command("/usr/local/bin/terrace-runner")
	if runner.Name() != "terrace-runner" || runner.Flags().Lookup("listen") == nil || runner.Flags().Lookup("warm") == nil {
		t.Fatalf("started as terrace-runner: command %q, want the runner with its flags", runner.Name())
	}
	root := command("/usr/local/bin/terrace")
	if root.Name() != "terrace" {
		t.Fatalf("started as terrace: command %q", root.Name())
	}
	if sub, _, err := root.Find([]string{"runner"}); err != nil || sub.Flags().Lookup("listen") == nil {
		t.Fatalf("terrace runner: %v", err)
	}
}
