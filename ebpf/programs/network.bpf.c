/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Network hooks. Sockets are matched by family and by the protocol they really use (the type's
 * default when the caller passes 0); destinations by address, IPv4-mapped IPv6 addresses being
 * the IPv4 address they carry; UNIX stream connects by the name the listening socket was bound
 * to, whatever path the caller reached it through.
 */
#include "path_match.h"

/* The protocol a socket of this family and type gets when the caller asks for protocol 0. */
static __always_inline __u32 default_protocol(int family, int type, int protocol)
{
	if (protocol || (family != AF_INET && family != AF_INET6))
		return protocol;
	switch (type & SOCK_TYPE_MASK) {
	case SOCK_STREAM:
		return IPPROTO_TCP;
	case SOCK_DGRAM:
		return IPPROTO_UDP;
	}
	return protocol;
}

SEC("lsm/socket_create")
int TARGET_HOOK(socket_create, int family, int type, int protocol, int kern, int ret)
{
	if (ret)
		return ret;
	if (kern)
		return 0; /* the kernel's own sockets */
	SUBJECT(subject, PALISADE_HOOK_SOCKET_CREATE);
	if (!find_subject(&subject))
		return 0;
	__u32 real_protocol = default_protocol(family, type, protocol);
	if (modeling(&subject)) {
		struct palisade_model_key *record = new_record(&subject, PALISADE_MODEL_SOCKET);
		if (record) {
			record->family = family;
			record->protocol = real_protocol;
			record->arg = type;
			count_record(record);
		}
	}
	if (!(subject.policy->lookups & PALISADE_LOOKUP_SOCKETS))
		return 0;
	struct palisade_socket_key key = {
		.policy_id = subject.policy_id,
		.family = family,
		.protocol = real_protocol,
	};
	struct palisade_verdict d = {};
	__u32 allowed = 0;
	/* A protocol number with PALISADE_SOCKET_TYPE's bit set would read a type's entry. */
	__u32 by_protocol = (real_protocol & PALISADE_SOCKET_TYPE) ? PALISADE_ANY_PROTOCOL
								    : real_protocol;
	__u32 protocols[] = { by_protocol, PALISADE_ANY_PROTOCOL, PALISADE_SOCKET_TYPE | type };
	for (__u32 i = 0; i < sizeof(protocols) / sizeof(protocols[0]); i++) {
		key.protocol = protocols[i];
		struct palisade_verdict *rule = bpf_map_lookup_elem(&sockets, &key);
		if (rule) {
			consider(&d, rule->action, rule->rule_id);
			allowed |= rule->action & PALISADE_ACTION_ALLOW;
		}
	}
	deny_by_default(&d, &subject, allowed ? 0 : PALISADE_DEFAULT_SOCKETS);
	if (d.action == PALISADE_ACTION_NONE)
		return 0;
	struct palisade_event *e = record(&d, &subject);
	if (e) {
		e->family = family;
		e->protocol = real_protocol;
		e->arg = type;
		submit_event(e, &subject);
	}
	return verdict_error(&d);
}

/* Looks up one (protocol, port) of the network trie; returns its allow bit. */
static __always_inline __u32 match_destination(struct palisade_network_key *key, __u8 protocol,
					       __u16 port, struct palisade_verdict *d)
{
	key->data.protocol = protocol;
	key->data.port = port;
	struct palisade_verdict *rule = bpf_map_lookup_elem(&network, key);
	if (!rule)
		return 0;
	consider(d, rule->action, rule->rule_id);
	return rule->action & PALISADE_ACTION_ALLOW;
}

/* Decides traffic from `sock` to the address at `address` (kernel memory, `len` bytes). */
static __always_inline int check_destination(__u32 hook, struct socket *sock, void *address,
					     int len)
{
	SUBJECT(subject, hook);
	if (!find_subject(&subject) ||
	    !((subject.policy->lookups & PALISADE_LOOKUP_NETWORK) || modeling(&subject)))
		return 0;
	struct sockaddr_in6 sa = {};
	if (!address || len < (int)sizeof(struct sockaddr_in) ||
	    bpf_probe_read_kernel(&sa, len < (int)sizeof(sa) ? sizeof(struct sockaddr_in) : sizeof(sa),
				  address))
		return 0;
	struct palisade_network_key key = { .prefixlen = PALISADE_NETWORK_FIXED_BITS + 128,
					    .data = { .policy_id = subject.policy_id } };
	if (sa.sin6_family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&sa;
		key.data.addr[10] = 0xff;
		key.data.addr[11] = 0xff;
		__builtin_memcpy(&key.data.addr[12], &in->sin_addr, 4);
	} else if (sa.sin6_family == AF_INET6 && len >= (int)sizeof(sa)) {
		__builtin_memcpy(key.data.addr, sa.sin6_addr, 16);
	} else {
		return 0;
	}
	__u16 port = bpf_ntohs(sa.sin6_port);
	__u8 protocol = BPF_CORE_READ(sock, sk, sk_protocol);
	/* ICMPv6 is ICMP to rules. */
	__u8 rule_protocol = protocol == IPPROTO_ICMPV6 ? IPPROTO_ICMP : protocol;
	if (modeling(&subject)) {
		struct palisade_model_key *record = new_record(&subject, PALISADE_MODEL_PEER);
		if (record) {
			record->family = sa.sin6_family;
			record->protocol = protocol;
			record->port = port;
			__builtin_memcpy(record->addr, key.data.addr, 16);
			count_record(record);
		}
	}
	if (!(subject.policy->lookups & PALISADE_LOOKUP_NETWORK))
		return 0;
	struct palisade_verdict d = {};
	__u32 allowed = match_destination(&key, rule_protocol, port, &d) |
			match_destination(&key, rule_protocol, 0, &d) |
			match_destination(&key, 0, port, &d) | match_destination(&key, 0, 0, &d);
	deny_by_default(&d, &subject, allowed ? 0 : PALISADE_DEFAULT_NETWORK);
	if (d.action == PALISADE_ACTION_NONE)
		return 0;
	struct palisade_event *e = record(&d, &subject);
	if (e) {
		e->family = sa.sin6_family;
		e->protocol = protocol;
		e->port = port;
		__builtin_memcpy(e->addr, key.data.addr, 16);
		submit_event(e, &subject);
	}
	return verdict_error(&d);
}

SEC("lsm/socket_connect")
int TARGET_HOOK(socket_connect, struct socket *sock, struct sockaddr *address, int addrlen, int ret)
{
	if (ret)
		return ret;
	return check_destination(PALISADE_HOOK_SOCKET_CONNECT, sock, address, addrlen);
}

SEC("lsm/socket_sendmsg")
int TARGET_HOOK(socket_sendmsg, struct socket *sock, struct msghdr *msg, int size, int ret)
{
	if (ret)
		return ret;
	/* Only datagrams with an address of their own: a connected socket was checked at connect. */
	return check_destination(PALISADE_HOOK_SOCKET_SENDMSG, sock, msg->msg_name,
				 msg->msg_namelen);
}

SEC("lsm/socket_setsockopt")
int TARGET_HOOK(socket_setsockopt, struct socket *sock, int level, int optname, int ret)
{
	if (ret)
		return ret;
	int attaches_bpf = (level == SOL_SOCKET &&
			    (optname == SO_ATTACH_FILTER || optname == SO_ATTACH_BPF ||
			     optname == SO_ATTACH_REUSEPORT_CBPF ||
			     optname == SO_ATTACH_REUSEPORT_EBPF)) ||
			   (level == SOL_PACKET && optname == PACKET_FANOUT_DATA);
	if (!attaches_bpf)
		return 0;
	SUBJECT(subject, PALISADE_HOOK_SOCKET_SETSOCKOPT);
	if (!find_subject(&subject))
		return 0;
	if (modeling(&subject))
		record_operation(&subject, PALISADE_MODEL_OPERATION, (__u32)level << 16 | (__u32)optname);
	return decide(&subject.policy->setsockopt_bpf, &subject, (__u32)level << 16 | (__u32)optname);
}

SEC("lsm/unix_stream_connect")
int TARGET_HOOK(unix_stream_connect, struct sock *sock, struct sock *other, struct sock *newsk,
	     int ret)
{
	if (ret)
		return ret;
	SUBJECT(subject, PALISADE_HOOK_UNIX_STREAM_CONNECT);
	struct scratch *s = find_path_subject(&subject);
	if (!s)
		return 0;
	struct unix_address *addr = BPF_CORE_READ((struct unix_sock *)other, addr);
	if (!addr)
		return 0; /* an unbound socket has no name to match */
	/* The name's bytes: a path name's include its NUL, an abstract name's do not. */
	int bytes = BPF_CORE_READ(addr, len) - (int)sizeof(unsigned short);
	if (bytes <= 0)
		return 0;
	/* name[0].sun_path: sun_path follows the 2-byte sun_family (UAPI). */
	const char *sun_path =
		(const char *)addr + bpf_core_field_offset(struct unix_address, name) + 2;
	if (bpf_probe_read_kernel(s->path, UNIX_PATH_MAX, sun_path))
		return 0;
	__u32 len = bytes > UNIX_PATH_MAX - 1 ? UNIX_PATH_MAX - 1 : bytes;
	if (s->path[0] == 0) {
		/* Abstract: rules write the leading NUL as "@". */
		s->path[0] = '@';
		len++;
	}
	s->path[(len - 1) & 127] = 0; /* len <= UNIX_PATH_MAX < 128 */
	if (modeling(&subject))
		record_file(&subject, s, len, PALISADE_PERM_CONNECT);
	struct palisade_verdict d = {};
	__u32 allowed = match_path(subject.policy_id, s, len, PALISADE_PERM_CONNECT, &d);
	deny_by_default(&d, &subject, PALISADE_PERM_CONNECT & ~allowed);
	if (d.action == PALISADE_ACTION_NONE)
		return 0;
	return decide_path(&d, &subject, s, NULL, PALISADE_PERM_CONNECT, 0);
}
