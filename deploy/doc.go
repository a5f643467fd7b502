// Package deploy holds ymirflow's Kubernetes/OpenShift manifests (kustomize:
// base/, overlays/dev, overlays/prod) and its Containerfile. It has no Go API:
// its tests build every overlay in-process with sigs.k8s.io/kustomize/api,
// decode every object strictly into k8s.io/api types, and hold the manifests
// to the binary's own settings (package cmd/ymirflow/config): every environment
// variable they set is one the command reads, every container's settings pass
// the command's validation, and the termination grace period covers the
// worker's shutdown budget. See README.md for how to deploy.
package deploy
