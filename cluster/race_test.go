//go:build race

package cluster_test

// raceBuild: the tests run with the race detector, and so do the nodes
// they start.
const raceBuild = true
