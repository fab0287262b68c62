"""Generated kubelet APIs: Device Plugin v1beta1 and pod-resources v1 (hack/gen_proto.py from proto/)."""
