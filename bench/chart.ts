/**
 * Line charts for benchmark results as standalone SVG, drawn by Vega-Lite and
 * rendered headless by Vega's SVG renderer (no canvas, no browser): one line
 * per series, axes with titles, a legend, and optional horizontal reference
 * lines (e.g. a target loss).
 */
import * as vega from 'vega';
import * as vegaLite from 'vega-lite';

export interface LineSeries {
  name: string;
  points: { x: number; y: number }[];
  /** A shaded range around the line (e.g. min–max over repeated runs), in the series' colour. */
  band?: { x: number; lo: number; hi: number }[];
}

export interface LineChartOptions {
  title: string;
  /** A second title line in smaller type. */
  subtitle?: string | string[];
  xTitle: string;
  yTitle: string;
  /** Title above the legend; none by default. */
  legendTitle?: string;
  series: LineSeries[];
  /** Horizontal dashed lines with a label at their right end. */
  rules?: { y: number; label: string }[];
  /** y domain; default: fitted to the data (not from zero). */
  yDomain?: [number, number];
  width?: number;
  height?: number;
  /** One colour per series, in order. */
  colors?: string[];
}

const DEFAULT_COLORS = ['#d62728', '#1f77b4', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b'];

export async function lineChartSvg(o: LineChartOptions): Promise<string> {
  const values = o.series.flatMap((s) => s.points.map((p) => ({ series: s.name, x: p.x, y: p.y })));
  const names = o.series.map((s) => s.name);
  // Not clamped: points outside the domain are cut off by the clip, not drawn on the edge as if they were there.
  const yScale = o.yDomain ? { domain: o.yDomain, zero: false } : { zero: false };
  const colorScale = { domain: names, range: (o.colors ?? DEFAULT_COLORS).slice(0, names.length) };
  const bands = o.series.flatMap((s) => (s.band ?? []).map((p) => ({ series: s.name, x: p.x, lo: p.lo, hi: p.hi })));
  const layers: Record<string, unknown>[] = [];
  if (bands.length > 0) {
    layers.push({
      data: { values: bands },
      mark: { type: 'area', opacity: 0.18, clip: true },
      encoding: {
        x: { field: 'x', type: 'quantitative' },
        y: { field: 'lo', type: 'quantitative', scale: yScale },
        y2: { field: 'hi' },
        // The same colour scale as the lines: Vega-Lite merges the two into the lines' legend.
        color: { field: 'series', type: 'nominal', scale: colorScale },
      },
    });
  }
  layers.push({
    mark: { type: 'line', point: { filled: true, size: 28 }, strokeWidth: 2, clip: true },
    encoding: {
      x: { field: 'x', type: 'quantitative', title: o.xTitle },
      y: { field: 'y', type: 'quantitative', title: o.yTitle, scale: yScale },
      color: {
        field: 'series', type: 'nominal', title: o.legendTitle ?? null,
        scale: colorScale,
        legend: { orient: 'top-right', labelFontSize: 13, labelLimit: 600, symbolStrokeWidth: 3, fillColor: 'white', padding: 6, strokeColor: '#ccc' },
      },
    },
  });
  if (o.rules?.length) {
    layers.push({
      data: { values: o.rules },
      mark: { type: 'rule', strokeDash: [6, 4], color: '#555', strokeWidth: 1.2 },
      encoding: { y: { field: 'y', type: 'quantitative' } },
    });
    layers.push({
      data: { values: o.rules },
      mark: { type: 'text', align: 'right', baseline: 'bottom', dy: -3, color: '#333', fontSize: 12 },
      encoding: { y: { field: 'y', type: 'quantitative' }, x: { value: o.width ?? 720 }, text: { field: 'label' } },
    });
  }
  const spec = {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: { text: o.title, subtitle: o.subtitle ?? '', fontSize: 16, subtitleFontSize: 12, subtitleColor: '#444', anchor: 'start' },
    width: o.width ?? 720,
    height: o.height ?? 380,
    background: 'white',
    config: { axis: { labelFontSize: 12, titleFontSize: 13, grid: true, gridColor: '#e6e6e6' }, view: { stroke: '#bbb' } },
    data: { values },
    layer: layers,
  };
  // Built as plain objects (the layers vary); Vega-Lite validates the spec when it compiles it.
  const compiled = vegaLite.compile(spec as unknown as vegaLite.TopLevelSpec).spec;
  const view = new vega.View(vega.parse(compiled), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}
