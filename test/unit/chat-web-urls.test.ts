import { describe, expect, test } from 'vitest';
import { isPublicAddress, refusedAddressReason } from '../../server/domains/chat/web/address.ts';
import { extractUrls, MAX_SCRAPE_URLS } from '../../server/domains/chat/web/scrape.ts';

describe('extractUrls', () => {
  test('behavior: http(s) URLs in order of appearance, de-duplicated', () => {
    const text = 'Read https://a.example/x?y=1#z then http://b.example/ and https://a.example/x?y=1#z again.';
    expect(extractUrls(text)).toEqual(['https://a.example/x?y=1#z', 'http://b.example/']);
  });

  test('behavior: at most 5 by default, or the given max', () => {
    const text = Array.from({ length: 8 }, (_, i) => `https://site${i}.example/`).join(' ');
    expect(MAX_SCRAPE_URLS).toBe(5);
    expect(extractUrls(text)).toHaveLength(5);
    expect(extractUrls(text, 2)).toEqual(['https://site0.example/', 'https://site1.example/']);
    expect(extractUrls(text, 0)).toEqual([]);
  });

  test('behavior: trailing punctuation and unbalanced brackets are not part of the URL', () => {
    expect(extractUrls('See https://a.example/page.')).toEqual(['https://a.example/page']);
    expect(extractUrls('(see https://a.example/page), ok?')).toEqual(['https://a.example/page']);
    expect(extractUrls('[docs](https://a.example/docs)')).toEqual(['https://a.example/docs']);
    expect(extractUrls('https://en.example/wiki/Foo_(bar) is kept')).toEqual([
      'https://en.example/wiki/Foo_(bar)',
    ]);
    expect(extractUrls('"https://a.example/q"')).toEqual(['https://a.example/q']);
    expect(extractUrls('<https://a.example/angle>')).toEqual(['https://a.example/angle']);
  });

  test('behavior: other schemes and broken URLs are ignored', () => {
    expect(
      extractUrls('ftp://a.example/ file:///etc/passwd javascript:alert(1) https:// http://[::1'),
    ).toEqual([]);
  });

  test('behavior: URLs are returned canonical (numeric IPv4 spellings become dotted quads)', () => {
    expect(extractUrls('http://2130706433/ and HTTP://EXAMPLE.com')).toEqual([
      'http://127.0.0.1/',
      'http://example.com/',
    ]);
  });
});

describe('refusedAddressReason', () => {
  test('behavior: public unicast IPv4 and IPv6 are allowed', () => {
    for (const address of ['8.8.8.8', '1.1.1.1', '93.184.216.34', '2606:4700:4700::1111', '::ffff:8.8.8.8']) {
      expect(refusedAddressReason(address), address).toBeUndefined();
      expect(isPublicAddress(address)).toBe(true);
    }
  });

  test('behavior: private, CGNAT, loopback, link-local, unspecified, multicast and reserved IPv4 are refused', () => {
    const refused = {
      '10.0.0.1': 'private',
      '172.16.5.4': 'private',
      '172.31.255.255': 'private',
      '192.168.1.1': 'private',
      '100.64.0.1': 'carrierGradeNat',
      '100.127.255.254': 'carrierGradeNat',
      '127.0.0.1': 'loopback',
      '127.255.255.254': 'loopback',
      '169.254.169.254': 'linkLocal',
      '0.0.0.0': 'unspecified',
      '224.0.0.1': 'multicast',
      '255.255.255.255': 'broadcast',
      '240.0.0.1': 'reserved',
    };
    for (const [address, range] of Object.entries(refused)) {
      expect(refusedAddressReason(address), address).toBe(`${range} address`);
    }
    // Just outside the ranges: allowed.
    expect(isPublicAddress('172.32.0.1')).toBe(true);
    expect(isPublicAddress('100.128.0.1')).toBe(true);
  });

  test('behavior: IPv6 loopback, unspecified, ULA, link-local, multicast and embedded-IPv4 forms are refused', () => {
    for (const address of [
      '::1',
      '::',
      'fc00::1',
      'fd12:3456::1',
      'fe80::1',
      'febf::1',
      'ff02::1',
      '::ffff:127.0.0.1',
      '::ffff:7f00:1',
      '::ffff:10.0.0.1',
      '::ffff:169.254.169.254',
      '::127.0.0.1', // IPv4-compatible (deprecated)
      '64:ff9b::7f00:1', // NAT64
      '2002:7f00:1::', // 6to4 of 127.0.0.1
      '2001::1', // Teredo
      '[::1]',
    ]) {
      expect(isPublicAddress(address), address).toBe(false);
    }
  });

  test('behavior: anything that is not an IP address is refused', () => {
    expect(refusedAddressReason('localhost')).toBe('not an IP address');
    expect(refusedAddressReason('2130706433')).toBe('not an IP address');
  });
});
