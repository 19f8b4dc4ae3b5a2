/**
 * A chat answer's event stream (server/domains/chat/event-stream.ts) on a recording response: the frames of one
 * turn of the event loop leave in one write after the turn, the head before them, the last frames before the
 * end; a write the socket refuses makes the next frames wait for its drain; nothing is added once the client is
 * gone. (How it leaves a real socket: `chat.test.ts` and `chat-upstream.test.ts`, "socket writes".)
 */
import { EventEmitter } from 'node:events';
import type { ServerResponse } from 'node:http';
import { describe, expect, test } from 'vitest';
import { openEventStream } from '../../server/domains/chat/event-stream.ts';

/** A response that records what is done to it; `accept` decides what its writes answer. */
function recording() {
  const calls: string[] = [];
  const res = Object.assign(new EventEmitter(), {
    destroyed: false,
    accept: true,
    writeHead(status: number, headers: Record<string, string>) {
      calls.push(`head ${status} ${headers['Content-Type']}`);
    },
    cork: () => calls.push('cork'),
    uncork: () => calls.push('uncork'),
    flushHeaders: () => calls.push('flushHeaders'),
    write(text: string) {
      calls.push(`write ${JSON.stringify(text)}`);
      return res.accept;
    },
    end: () => calls.push('end'),
  });
  return { res, calls, response: res as unknown as ServerResponse };
}

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

describe('openEventStream', () => {
  test("a turn's frames leave in one write after the turn, the head corked before them", async () => {
    const { response, calls } = recording();
    const stream = openEventStream(response, () => false);
    expect(stream.write('{"a":1}')).toBeUndefined();
    expect(stream.write('{"b":2}')).toBeUndefined();
    expect(calls).toEqual(['head 200 text/event-stream; charset=utf-8', 'cork', 'flushHeaders']);
    await turn();
    expect(calls.slice(3)).toEqual([
      `write ${JSON.stringify('data: {"a":1}\n\ndata: {"b":2}\n\n')}`,
      'uncork',
    ]);
    stream.write('[DONE]');
    await turn();
    expect(calls.slice(5)).toEqual([`write ${JSON.stringify('data: [DONE]\n\n')}`]);
  });

  test('end writes what is gathered, then ends (no uncork after: the end uncorks)', async () => {
    const { response, calls } = recording();
    const stream = openEventStream(response, () => false);
    stream.write('{"a":1}');
    stream.write('[DONE]');
    stream.end();
    expect(calls.slice(3)).toEqual([`write ${JSON.stringify('data: {"a":1}\n\ndata: [DONE]\n\n')}`, 'end']);
    await turn();
    expect(calls.slice(5)).toEqual([]);
  });

  test('a write the socket refuses: the next frames get a promise until it drains', async () => {
    const { res, response, calls } = recording();
    const stream = openEventStream(response, () => false);
    res.accept = false;
    stream.write('{"a":1}');
    await turn(); // written, refused
    res.accept = true;
    const waiting = stream.write('{"b":2}');
    expect(waiting).toBeInstanceOf(Promise);
    expect(stream.write('{"c":3}')).toBe(waiting);
    let drained = false;
    void waiting?.then(() => {
      drained = true;
    });
    await turn();
    expect(drained).toBe(false);
    res.emit('drain');
    await waiting;
    expect(drained).toBe(true);
    expect(stream.write('{"d":4}')).toBeUndefined();
    expect(res.listenerCount('drain') + res.listenerCount('close')).toBe(0);
    await turn();
    expect(calls.filter((c) => c.startsWith('write')).length).toBe(3);
  });

  test('a response that closes while refused lets the waiting frames go on', async () => {
    const { res, response } = recording();
    const stream = openEventStream(response, () => false);
    res.accept = false;
    stream.write('{"a":1}');
    await turn();
    const waiting = stream.write('{"b":2}');
    res.emit('close');
    await expect(waiting).resolves.toBeUndefined();
  });

  test('nothing is added once the client is gone or the response destroyed', async () => {
    let gone = false;
    const { res, response, calls } = recording();
    const stream = openEventStream(response, () => gone);
    gone = true;
    expect(stream.write('{"a":1}')).toBeUndefined();
    await turn();
    gone = false;
    res.destroyed = true;
    expect(stream.write('{"b":2}')).toBeUndefined();
    stream.end();
    expect(calls.filter((c) => c.startsWith('write'))).toEqual([]);
  });
});
