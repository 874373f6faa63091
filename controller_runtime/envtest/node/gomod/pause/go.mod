module controller-runtime-py.invalid/envtest/node/pause

go 1.26.0
