/*
 * svg.c - a two-series line chart as plain SVG (see svg.h). Each y axis
 * starts at 0 and ends at a "nice" bound (1, 2 or 5 times a power of ten,
 * five ticks); the x axis is categorical. A value that is not finite (a
 * point without a run) gets no marker and the line skips it. Deterministic: the same input
 * writes the same bytes (fixed decimals, no clock).
 */
#include "svg.h"

#include <math.h>
#include <string.h>

enum { SVG_W = 720, SVG_H = 420, SVG_LEFT = 80, SVG_RIGHT = 80, SVG_TOP = 60,
       SVG_BOTTOM = 70, SVG_TICKS = 5 };

static const char *const svg_colors[2] = {"#c0392b", "#2471a3"};

static void svg_text(FILE *out, const char *s)
{
    for (; *s != '\0'; s++) {
        switch (*s) {
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '&': fputs("&amp;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(*s, out);
        }
    }
}

/* The smallest 1, 2 or 5 x 10^k at least max / SVG_TICKS, times the ticks. */
static double svg_nice_top(const double *v, size_t n)
{
    double max = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i]) && v[i] > max)
            max = v[i];
    if (max <= 0)
        return 1.0;
    const double raw = max / SVG_TICKS;
    const double p = pow(10.0, floor(log10(raw)));
    const double step = raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
    return step * SVG_TICKS;
}

static void svg_tick_label(char *buf, size_t len, double v)
{
    if (v == 0 || fabs(v) >= 100)
        snprintf(buf, len, "%.0f", v);
    else if (fabs(v) >= 1)
        snprintf(buf, len, "%.1f", v);
    else
        snprintf(buf, len, "%.3g", v);
}

static double svg_x(size_t i, size_t n)
{
    const double plot_w = SVG_W - SVG_LEFT - SVG_RIGHT;
    return SVG_LEFT + (n > 1 ? plot_w * (0.05 + 0.9 * (double)i / (double)(n - 1)) : plot_w / 2);
}

static double svg_y(double v, double top)
{
    const double plot_h = SVG_H - SVG_TOP - SVG_BOTTOM;
    if (!isfinite(v) || v < 0)
        v = 0;
    return SVG_TOP + plot_h * (1.0 - v / top);
}

/* One axis's ticks, grid (left only) and title; side 0 left, 1 right. */
static void svg_axis(FILE *out, const cli_svg_series_t *s, double top, int side)
{
    const double x = side == 0 ? SVG_LEFT : SVG_W - SVG_RIGHT;
    const double dir = side == 0 ? -1 : 1;
    fprintf(out, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\"/>\n", x,
            SVG_TOP, x, SVG_H - SVG_BOTTOM, svg_colors[side]);
    for (int t = 0; t <= SVG_TICKS; t++) {
        const double v = top * t / SVG_TICKS;
        const double y = svg_y(v, top);
        char label[32];
        svg_tick_label(label, sizeof label, v);
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n",
                x, y, x + 5 * dir, y, svg_colors[side]);
        if (side == 0 && t > 0)
            fprintf(out, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                    SVG_LEFT, y, SVG_W - SVG_RIGHT, y);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" fill=\"%s\">%s</text>\n",
                x + 8 * dir, y + 4, side == 0 ? "end" : "start", svg_colors[side], label);
    }
    const double tx = side == 0 ? 20 : SVG_W - 20;
    const double ty = (SVG_TOP + SVG_H - SVG_BOTTOM) / 2.0;
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"%s\" "
            "transform=\"rotate(%d %.1f %.1f)\">", tx, ty, svg_colors[side],
            side == 0 ? -90 : 90, tx, ty);
    svg_text(out, s->name);
    fputs("</text>\n", out);
}

static void svg_series(FILE *out, const cli_svg_series_t *s, size_t n, double top, int side)
{
    fprintf(out, "<g class=\"series\" data-name=\"");
    svg_text(out, s->name);
    fprintf(out, "\">\n<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
            svg_colors[side]);
    for (size_t i = 0, drawn = 0; i < n; i++)
        if (isfinite(s->values[i]))
            fprintf(out, "%s%.1f,%.1f", drawn++ > 0 ? " " : "", svg_x(i, n),
                    svg_y(s->values[i], top));
    fputs("\"/>\n", out);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(s->values[i]))
            continue; /* no run at this point: no marker */
        const double x = svg_x(i, n), y = svg_y(s->values[i], top);
        if (side == 0)
            fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>\n", x, y,
                    svg_colors[side]);
        else
            fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"8\" height=\"8\" fill=\"%s\"/>\n",
                    x - 4, y - 4, svg_colors[side]);
    }
    fputs("</g>\n", out);
}

int cli_svg_chart(FILE *out, const char *title, const char *x_title,
                  const char *const *x_labels, size_t n, const cli_svg_series_t *left,
                  const cli_svg_series_t *right)
{
    const double top_l = svg_nice_top(left->values, n);
    const double top_r = svg_nice_top(right->values, n);
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            SVG_W, SVG_H, SVG_W, SVG_H);
    fputs("<title>", out);
    svg_text(out, title);
    fputs("</title>\n", out);
    fprintf(out, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", SVG_W, SVG_H);
    fprintf(out, "<text x=\"%d\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" "
            "font-weight=\"bold\">", SVG_W / 2);
    svg_text(out, title);
    fputs("</text>\n", out);
    /* x axis: the points, evenly spaced, in the order given */
    fprintf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n",
            SVG_LEFT, SVG_H - SVG_BOTTOM, SVG_W - SVG_RIGHT, SVG_H - SVG_BOTTOM);
    for (size_t i = 0; i < n; i++) {
        const double x = svg_x(i, n);
        fprintf(out, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n",
                x, SVG_H - SVG_BOTTOM, x, SVG_H - SVG_BOTTOM + 5);
        fprintf(out, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", x,
                SVG_H - SVG_BOTTOM + 20);
        svg_text(out, x_labels[i]);
        fputs("</text>\n", out);
    }
    fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">",
            (SVG_LEFT + SVG_W - SVG_RIGHT) / 2, SVG_H - SVG_BOTTOM + 45);
    svg_text(out, x_title);
    fputs("</text>\n", out);
    svg_axis(out, left, top_l, 0);
    svg_axis(out, right, top_r, 1);
    svg_series(out, left, n, top_l, 0);
    svg_series(out, right, n, top_r, 1);
    /* legend, top left inside the plot */
    fprintf(out, "<g class=\"legend\">\n<rect x=\"%d\" y=\"%d\" width=\"190\" height=\"44\" "
            "fill=\"white\" stroke=\"#999\"/>\n", SVG_LEFT + 10, SVG_TOP + 6);
    const cli_svg_series_t *series[2] = {left, right};
    for (int k = 0; k < 2; k++) {
        const int y = SVG_TOP + 22 + 18 * k;
        fprintf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
                "stroke-width=\"2\"/>\n<text x=\"%d\" y=\"%d\">", SVG_LEFT + 18, y,
                SVG_LEFT + 40, y, svg_colors[k], SVG_LEFT + 46, y + 4);
        svg_text(out, series[k]->name);
        fputs(k == 0 ? " (left)" : " (right)", out);
        fputs("</text>\n", out);
    }
    fputs("</g>\n</svg>\n", out);
    return ferror(out) ? -1 : 0;
}
