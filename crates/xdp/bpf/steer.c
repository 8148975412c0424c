// SPDX-License-Identifier: MIT OR Apache-2.0
//
// pmnet's XDP program: steers the IPv4/UDP datagrams addressed to a PMNet destination
// (destination address and port listed in the `steer` map) to the AF_XDP socket registered for
// the receive queue in `xsks`; every other frame goes on to the kernel's stack untouched
// (XDP_PASS), so ARP, ICMP, SSH and any other UDP port keep working on the interface.
//
// Built by crates/xdp/build.rs with `clang -O2 -g -target bpf`, from kernel uapi headers only:
// SEC(), the BTF-style map definitions and the helper ids are declared here (no libbpf needed).
// The loader (src/loader.rs) relies on the names `pmnet_steer`, `steer`, `xsks` and
// `counters`, and on the counter indices below.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/types.h>
#include <linux/udp.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

// Helper ids from enum bpf_func_id (linux/bpf.h): stable kernel ABI.
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)BPF_FUNC_redirect_map;

#define bpf_htons(x) ((__be16)__builtin_bswap16(x))
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ETH_P_IP_BE bpf_htons(ETH_P_IP)
#define ETH_P_8021Q_BE bpf_htons(ETH_P_8021Q)
#define IP_FRAG_MASK_BE bpf_htons(0x3fff) // MF flag and fragment offset
#define bpf_ntohs(x) ((__u16)__builtin_bswap16(x))
#else
#define bpf_ntohs(x) ((__u16)(x))
#define ETH_P_IP_BE ETH_P_IP
#define ETH_P_8021Q_BE ETH_P_8021Q
#define IP_FRAG_MASK_BE 0x3fff
#endif

// A steered destination: the IPv4 address and UDP port exactly as they appear in the packet
// (network byte order), then two bytes of zero padding (8 bytes, no holes for the hash).
struct steer_key {
	__u32 addr;
	__u16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct steer_key);
	__type(value, __u8);
} steer SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

// Per-CPU counters (no atomics on the fast path); the loader sums them.
#define COUNTER_STEERED 0   // redirected to an AF_XDP socket
#define COUNTER_PASSED 1    // not IPv4/UDP, a fragment, not a steered destination, no socket
#define COUNTER_MALFORMED 2 // too short for the headers it announces, or ihl < 5
#define COUNTER_COUNT 3

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *value = bpf_map_lookup_elem(&counters, &which);
	if (value)
		*value += 1;
}

struct vlan_tag {
	__be16 tci;
	__be16 proto;
};

// "xdp.frags": the program also takes frames in several buffers (multi-buffer XDP), so a
// driver keeps large frames (veth keeps its peers' TSO/GSO, which TCP through the device
// needs for its speed). Only the first buffer is looked at: the headers are there; a frame
// whose IPv4 packet goes on past it is passed on, never steered (the AF_XDP sockets take
// single buffers).
SEC("xdp.frags")
int pmnet_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	void *cursor;
	__be16 proto;

	if ((void *)(eth + 1) > data_end)
		goto malformed;
	proto = eth->h_proto;
	cursor = eth + 1;
	// One 802.1Q tag is looked through (the user-space parser accepts the same frames).
	if (proto == ETH_P_8021Q_BE) {
		struct vlan_tag *vlan = cursor;
		if ((void *)(vlan + 1) > data_end)
			goto malformed;
		proto = vlan->proto;
		cursor = vlan + 1;
	}
	if (proto != ETH_P_IP_BE)
		goto pass;

	struct iphdr *ip = cursor;
	if ((void *)(ip + 1) > data_end)
		goto malformed;
	if (ip->version != 4 || ip->ihl < 5)
		goto malformed;
	if (ip->protocol != IPPROTO_UDP)
		goto pass;
	// Fragments (first or later) go to the kernel, which reassembles them.
	if (ip->frag_off & IP_FRAG_MASK_BE)
		goto pass;

	struct udphdr *udp = cursor + ip->ihl * 4;
	if ((void *)(udp + 1) > data_end)
		goto malformed;

	struct steer_key key = {
		.addr = ip->daddr,
		.port = udp->dest,
		.pad = 0,
	};
	if (!bpf_map_lookup_elem(&steer, &key))
		goto pass;
	if ((void *)ip + bpf_ntohs(ip->tot_len) > data_end)
		goto pass; // in several buffers

	// XDP_PASS as the fallback action: a queue without a registered socket passes.
	long action = bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
	if (action == XDP_REDIRECT) {
		count(COUNTER_STEERED);
		return XDP_REDIRECT;
	}
pass:
	count(COUNTER_PASSED);
	return XDP_PASS;
malformed:
	count(COUNTER_MALFORMED);
	return XDP_PASS;
}

char _license[] SEC("license") = "Dual MIT/GPL";
