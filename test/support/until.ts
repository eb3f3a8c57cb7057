/** Waits until `pred` holds, checking every 20 ms; fails naming `what` (and `explain()`, e.g. a log tail) after `timeoutMs`. */
export async function until(pred: () => boolean | Promise<boolean>, what = 'the condition', timeoutMs = 15_000, explain: () => string = () => ''): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await pred())) {
    if (Date.now() > end) {
      const more = explain();
      throw new Error(`${what} did not happen within ${timeoutMs / 1000} s${more ? `\n${more}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}
