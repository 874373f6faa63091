//go:build tools

package tools

import _ "github.com/k3s-io/kine"
