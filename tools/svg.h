/*
 * svg.h - a line chart of two series against one axis of named points,
 * written as hand-made SVG (no library): title, both y axes with ticks and
 * labels (the first series on the left, the second on the right), the x
 * values as evenly spaced tick labels in the order given, a marker per
 * point, and a legend. Used by `kvstage sim --sweep` (sweep.h). Knows
 * nothing of the simulator.
 */
#ifndef KVSTAGE_TOOLS_SVG_H
#define KVSTAGE_TOOLS_SVG_H

#include <stddef.h>
#include <stdio.h>

/* One series: a name for the legend and the y axis, and n values. */
typedef struct cli_svg_series {
    const char *name;          /* e.g. "p99 TTFT (ms)" */
    const double *values;      /* [n] */
} cli_svg_series_t;

/* Writes the chart to out: x_labels[n] name the points along the x axis
 * (x_title), left and right are the two series. Returns 0, or -1 when out
 * reported a write error. Text is XML-escaped. */
int cli_svg_chart(FILE *out, const char *title, const char *x_title,
                  const char *const *x_labels, size_t n, const cli_svg_series_t *left,
                  const cli_svg_series_t *right);

#endif
