//go:build !race

package app

const raceOn = false
