/** Waits until the current clock minute has at least 15 s left (rate limits count per clock minute). */
export async function awayFromMinuteEdge(): Promise<void> {
  const into = Date.now() % 60_000;
  if (into > 45_000) await new Promise((resolve) => setTimeout(resolve, 60_000 - into + 200));
}
