"""Generated kubelet Device Plugin API v1beta1 (hack/gen_proto.py from proto/)."""
