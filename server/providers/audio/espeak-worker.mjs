/**
 * The eSpeak NG synthesiser (compiled to JavaScript) in a worker thread, so that synthesis never blocks the
 * server's event loop. Deterministic: after start-up the whole memory of the compiled engine is kept, and
 * restored before every job, so the same job always starts from the same state (the engine keeps a random
 * generator and caches in that memory) and gives the same samples.
 *
 * In:  { id, voice, fallbackVoice, variant, language?, rate, pitch, text } (a known `language` picks the voice)
 * Out: { id, samples: Int16Array } as synthesis goes, then { id, done: true, sampleRate } or { id, error }.
 */
import { parentPort } from 'node:worker_threads';

// The engine seeds its random generator from the clock at start-up: a fixed clock in this thread (nothing
// else runs here) makes every instance, in every process, start from the same state.
Date.now = () => 0;
const { default: createEspeak } = await import('@echogarden/espeak-ng-emscripten');
const engine = await createEspeak();
const worker = new engine.eSpeakNGWorker();

/** Voice identifier by language code and name (`en-gb`, `de`, `german`…), lower-cased. */
const byLanguage = new Map();
for (const voice of worker.list_voices()) {
  for (const language of voice.languages)
    if (!byLanguage.has(language.name)) byLanguage.set(language.name, voice.identifier);
  const name = voice.name.toLowerCase();
  if (!byLanguage.has(name)) byLanguage.set(name, voice.identifier);
}

function synthesize(text, onSamples) {
  worker.synthesize(text, (samples) => {
    if (samples && samples.length > 0) onSamples(samples);
    return 0;
  });
}

// Grow the engine's string buffer to the largest input (4096 code points, 4 bytes each in UTF-8) before the
// snapshot, so no job allocates memory that the next restore would take back from under it.
const largest = '\u{1F600}'.repeat(4100);
worker.set_voice(largest);
worker.set_voice(largest);
worker.set_voice('en-us');
synthesize('Ready.', () => {});
const snapshot = new Uint8Array(engine.HEAP8.buffer).slice();

parentPort.on('message', (job) => {
  try {
    new Uint8Array(engine.HEAP8.buffer).set(snapshot);
    const language = job.language ? byLanguage.get(job.language.toLowerCase()) : undefined;
    const voice = `${language ?? job.voice}${job.variant}`;
    if (worker.set_voice(voice) !== 0 && worker.set_voice(`${job.fallbackVoice}${job.variant}`) !== 0)
      throw new Error(`unknown voice ${voice}`);
    worker.rate = job.rate;
    worker.pitch = job.pitch;
    synthesize(job.text, (samples) => parentPort.postMessage({ id: job.id, samples }, [samples.buffer]));
    parentPort.postMessage({ id: job.id, done: true, sampleRate: worker.samplerate });
  } catch (error) {
    parentPort.postMessage({ id: job.id, error: String(error?.message ?? error) });
  }
});
parentPort.postMessage({ ready: true });
