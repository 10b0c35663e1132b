//go:build !race

package cluster_test

const raceBuild = false
