/**
 * Which IP addresses a server-side fetch may connect to (the SSRF rule). An allow-list, not a block-list:
 * IPv4 must be ordinary unicast (no private, CGNAT, loopback, link-local, unspecified, multicast, broadcast or
 * reserved ranges); IPv6 must be global unicast inside 2000::/3 (which excludes ULA fc00::/7, link-local
 * fe80::/10, multicast, loopback, unspecified and the IPv4-compatible ::/96), minus the transition ranges
 * (6to4, Teredo, NAT64) that embed an IPv4 address; IPv4-mapped IPv6 (::ffff:a.b.c.d) is judged as its IPv4.
 */
import { isIP } from 'node:net';
import ipaddr from 'ipaddr.js';

const GLOBAL_UNICAST_V6 = ipaddr.IPv6.parseCIDR('2000::/3');

/** The reason an address is refused, or undefined when it is a public unicast address. */
export function refusedAddressReason(address: string): string | undefined {
  const literal = address.replace(/^\[|\]$/g, '');
  if (isIP(literal) === 0) return 'not an IP address';
  let parsed = ipaddr.parse(literal);
  if (parsed.kind() === 'ipv6' && (parsed as ipaddr.IPv6).isIPv4MappedAddress()) {
    parsed = (parsed as ipaddr.IPv6).toIPv4Address();
  }
  const range = parsed.range();
  if (parsed.kind() === 'ipv4') return range === 'unicast' ? undefined : `${range} address`;
  if (range !== 'unicast') return `${range} address`;
  return parsed.match(GLOBAL_UNICAST_V6) ? undefined : 'non-global IPv6 address';
}

/** True when a fetch may connect to this address. */
export function isPublicAddress(address: string): boolean {
  return refusedAddressReason(address) === undefined;
}
