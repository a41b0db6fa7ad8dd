package bench

// All lists the benchmark suites in the order `skyhive bench all` runs them.
// Each suite lives in its own file in this package.
func All() []Suite {
	return []Suite{
		// Suites register here, one line each.
		gemmSuite(),
		layersSuite(),
		allocSuite(),
		rpcSuite(),
		dhtSuite(),
		averagingSuite(),
		pipelineSuite(),
		moeSuite(),
		hostileSuite(),
		pytorchSuite(),
	}
}

// Long lists the suites that take longer than 2 minutes; `bench all`
// leaves them out.
func Long() []Suite { return []Suite{soakSuite()} }

// Find returns the suite with the given name.
func Find(name string) (Suite, bool) {
	for _, s := range append(All(), Long()...) {
		if s.Name == name {
			return s, true
		}
	}
	return Suite{}, false
}
