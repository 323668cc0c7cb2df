// Command protodeps writes the descriptors of the google.api HTTP
// annotations (and what they import) as a FileDescriptorSet, for protoc's
// --descriptor_set_in: the .proto files that import google/api/annotations.proto
// then compile against exactly the descriptors the Go code links
// (google.golang.org/genproto/googleapis/api, and the well-known types of
// google.golang.org/protobuf), with no copy of their source kept in the
// repository.
package main

import (
	"fmt"
	"os"

	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: protodeps <out.binpb>")
		os.Exit(2)
	}
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	var add func(protoreflect.FileDescriptor)
	// Dependencies first, as protoc expects.
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := range imports.Len() {
			add(imports.Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
	}
	add(annotations.File_google_api_annotations_proto)
	// The well-known types the API uses, from the same Go module that
	// marshals them (protoc reads imports from the set alone).
	add(structpb.File_google_protobuf_struct_proto)
	add(timestamppb.File_google_protobuf_timestamp_proto)
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(set)
	if err == nil {
		err = os.WriteFile(os.Args[1], raw, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "protodeps:", err)
		os.Exit(1)
	}
}
