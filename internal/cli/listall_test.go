package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
)

func TestListAll(t *testing.T) {
	pages := map[string]apiv1.List[int]{
		"":  {Items: []int{1, 2}, NextPageToken: "a"},
		"a": {Items: []int{3}, NextPageToken: ""},
	}
	var asked []string
	got, err := listAll(context.Background(), "ints", func(lo apiclient.ListOptions) (apiv1.List[int], error) {
		asked = append(asked, lo.PageToken)
		if lo.Limit != 1000 {
			t.Errorf("page of %d, want 1000", lo.Limit)
		}
		return pages[lo.PageToken], nil
	})
	if err != nil || len(got) != 3 || got[2] != 3 || strings.Join(asked, ",") != ",a" {
		t.Fatalf("got %v, %v after asking %q", got, err, asked)
	}
	// A server that hands back a token it gave before would loop forever.
	_, err = listAll(context.Background(), "ints", func(lo apiclient.ListOptions) (apiv1.List[int], error) {
		return apiv1.List[int]{Items: []int{1}, NextPageToken: "same"}, nil
	})
	if err == nil || !strings.Contains(err.Error(), `list ints: the server answered page token "same" twice`) {
		t.Fatalf("a looping token: %v", err)
	}
	// An empty list is an empty slice, which prints as [] in JSON.
	empty, err := listAll(context.Background(), "ints", func(apiclient.ListOptions) (apiv1.List[int], error) {
		return apiv1.List[int]{}, nil
	})
	if err != nil || empty == nil || len(empty) != 0 {
		t.Fatalf("empty list: %#v, %v", empty, err)
	}
}
