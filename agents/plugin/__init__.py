"""The device-plugin runtime: gRPC servers, registration, ListAndWatch; family-agnostic."""
