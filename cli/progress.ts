/**
 * The CLI's progress display for long work (`hetps up`, `hetps train-local`):
 * a cli-progress bar redrawn in place on a terminal, with other lines
 * printed above it; anywhere else (logs, CI, a pipe) a plain line when a
 * quarter of the work is done or `plainEveryMs` has passed, and at the end.
 */
import cliProgress from 'cli-progress';
import { performance } from 'node:perf_hooks';

export interface ProgressOptions {
  /** Plain (not a terminal) output: at most one line per this many ms, besides quarter marks. Default 5 s. */
  plainEveryMs?: number;
}

export class ProgressLine {
  private multi: cliProgress.MultiBar | null = null;
  private bar: cliProgress.SingleBar | null = null;
  private lastPlainAt = Number.NEGATIVE_INFINITY;
  private lastQuarter = -1;
  private lastText: string | null = null;
  private lastPrinted: string | null = null;

  constructor(private readonly out: NodeJS.WritableStream & { isTTY?: boolean } = process.stderr, private readonly o: ProgressOptions = {}) {}

  get tty(): boolean { return Boolean(this.out.isTTY); }

  /** The work so far: `text` beside the bar; `fraction` in [0, 1], null when unknown. */
  update(text: string, fraction: number | null): void {
    this.lastText = text;
    const f = fraction === null || !Number.isFinite(fraction) ? null : Math.min(1, Math.max(0, fraction));
    if (!this.tty) {
      const now = performance.now();
      const quarter = f === null ? this.lastQuarter : Math.floor(f * 4);
      if (quarter > this.lastQuarter || now - this.lastPlainAt >= (this.o.plainEveryMs ?? 5_000)) {
        this.lastQuarter = quarter;
        this.lastPlainAt = now;
        this.lastPrinted = text;
        this.out.write(`${text}\n`);
      }
      return;
    }
    if (this.multi === null) {
      this.multi = new cliProgress.MultiBar({
        stream: this.out as NodeJS.WritableStream, format: '{bar} {percentage}% {text}', barsize: 24, hideCursor: false,
        clearOnComplete: false, stopOnComplete: false, fps: 10, forceRedraw: true, autopadding: true,
      }, cliProgress.Presets.shades_classic);
      this.bar = this.multi.create(1000, 0, { text });
    }
    this.bar!.update(f === null ? this.bar!.getProgress() * 1000 : Math.round(f * 1000), { text });
  }

  /** A line above the bar (or just a line). */
  line(s: string): void {
    if (this.multi !== null) {
      this.multi.log(`${s}\n`);
      this.multi.update();
    } else {
      this.out.write(`${s}\n`);
    }
  }

  /** Ends the bar (its last state stays on screen); off a terminal, the last text is printed if it was not. */
  end(): void {
    if (this.multi !== null) {
      this.multi.stop();
      this.multi = null;
      this.bar = null;
    } else if (!this.tty && this.lastText !== null && this.lastText !== this.lastPrinted) {
      // Off a terminal the final figures always reach the log.
      this.out.write(`${this.lastText}\n`);
    }
    this.lastText = null;
    this.lastPrinted = null;
    this.lastQuarter = -1;
    this.lastPlainAt = Number.NEGATIVE_INFINITY;
  }
}
