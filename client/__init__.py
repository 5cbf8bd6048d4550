"""tierproxy's own Kafka client: the connections tierproxy opens itself (the pipeline,
`tierproxy status`, the proxy's metadata reads), with TLS, SASL, ApiVersions
negotiation and the cluster queries built on them. Imports only `protocol` and
`config`."""
