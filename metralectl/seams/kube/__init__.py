"""Kubernetes through its REST API (httpx, no client library): kubeconfig (config.py) and the calls `run/ps/logs/stop
--on kube` make (client.py). docs/kubernetes.md, "Run on a cluster"."""
