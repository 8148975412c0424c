//! A testbed of hosts in network namespaces (docs/inpath.md).
