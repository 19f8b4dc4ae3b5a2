/**
 * bench/trace-analysis.ts: the steps of each request from the trace hooks' stamps, their medians, the wait
 * before the next request, and where the slowest requests lost their time.
 */
import { expect, test } from 'vitest';
import { analyseTrace, renderTrace, type TraceDump } from '../../bench/trace-analysis.ts';

/** A dump of `requests` requests, each with the stamps (label, ms after its arrival) of `shape`. */
function dumpOf(
  requests: number,
  shape: (i: number) => Array<[string, number]>,
  gcs: TraceDump['gcs'] = [],
): TraceDump {
  const labels: string[] = [];
  const ids: number[] = [];
  const times: number[] = [];
  let at = 0;
  for (let i = 0; i < requests; i++) {
    for (const [label, offset] of shape(i)) {
      let id = labels.indexOf(label);
      if (id < 0) id = labels.push(label) - 1;
      ids.push(id);
      times.push(at + offset);
    }
    at += 1;
  }
  return { labels, ids, times, gcs };
}

// A request: arrives, two statements, the answer, its end 0.3 ms in; the capture commits at 0.45 ms.
const shape = (i: number): Array<[string, number]> => [
  ['req', 0],
  ['sql begin immediate', 0.05],
  ['sql done', 0.06],
  ['sql commit', 0.1],
  ['sql done', 0.12],
  ['writeHead', 0.2],
  ['end', 0.25],
  // Request 50 is slow in its end: 2 ms more.
  ['ended', i === 50 ? 2.3 : 0.3],
  ['sql commit', i === 50 ? 2.4 : 0.4],
  ['sql done', i === 50 ? 2.45 : 0.45],
];

test('each step is timed from one stamp to the next, a pair seen again in a request numbered', () => {
  const analysis = analyseTrace(dumpOf(102, shape));
  // The first and last requests are left out (a dump may cut them).
  expect(analysis.requests).toBe(100);
  const byStep = new Map(analysis.steps.map((s) => [s.step, s]));
  expect(byStep.get('req -> sql begin immediate')?.p50Us).toBeCloseTo(50, 6);
  expect(byStep.get('sql begin immediate -> sql done')?.p50Us).toBeCloseTo(10, 6);
  expect(byStep.get('sql commit -> sql done')?.p50Us).toBeCloseTo(20, 6);
  // The capture's commit is the second `sql commit -> sql done` of the request.
  expect(byStep.get('sql commit -> sql done #2')?.p50Us).toBeCloseTo(50, 6);
  expect(byStep.get('end -> ended')?.count).toBe(100);
  expect(analysis.sumOfMediansUs).toBeCloseTo(450, 6);
  // Each request arrives 1 ms after the last one: 0.7 ms after `ended`, 0.55 after its last stamp.
  expect(analysis.toNextRequest.p50Us).toBeCloseTo(700, 6);
  expect(analysis.idleBeforeNext.p50Us).toBeCloseTo(550, 6);
});

test('the slowest requests name the step that held them, and whether a collection ran meanwhile', () => {
  // A scavenge during request 50, none elsewhere.
  const analysis = analyseTrace(dumpOf(102, shape, [[50.5, 0.6, 1]]));
  expect(analysis.slowest.count).toBe(1);
  expect(analysis.slowest.durationsUs[0]).toBeCloseTo(2300, 6);
  expect(analysis.slowest.withGc).toBe(1);
  expect(analysis.slowest.stepsOverMedian).toEqual([{ step: 'end -> ended', requests: 1 }]);
  expect(analysis.gcs).toEqual({ scavenges: 1, markCompacts: 0, scavengeP50Ms: 0.6 });
  const text = renderTrace(analysis, 'Trace');
  expect(text).toContain('| end -> ended | 100 | 50.0 |');
  expect(text).toContain('end -> ended (1)');
});

test('stamps before the first arrival are dropped, and a step few requests took is not listed', () => {
  const dump = dumpOf(12, (i) => [
    ['req', 0],
    ...(i === 3 ? ([['rare', 0.1]] as Array<[string, number]>) : []),
    ['ended', 0.2],
  ]);
  dump.ids.unshift(dump.labels.push('stray') - 1);
  dump.times.unshift(-1);
  const analysis = analyseTrace(dump);
  expect(analysis.requests).toBe(10);
  expect(analysis.steps.map((s) => s.step)).toEqual(['req -> ended']);
});
