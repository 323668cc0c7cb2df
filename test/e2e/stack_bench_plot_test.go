package e2e

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// readyCurve is one side of a measurement: when each Stack (or direct
// apply) was done, from the start of the clock.
type readyCurve struct {
	name  string
	color color.RGBA
	done  []time.Duration
}

// Plot geometry, in pixels.
const (
	plotWidth, plotHeight = 900, 520
	plotLeft, plotRight   = 70, 20
	plotTop, plotBottom   = 40, 50
)

var (
	terraceBlue  = color.RGBA{0x1f, 0x5f, 0xbf, 0xff}
	directOrange = color.RGBA{0xd9, 0x6b, 0x00, 0xff}
	plotInk      = color.RGBA{0x20, 0x20, 0x20, 0xff}
	plotGrid     = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
)

// plotDir is where the benchmark writes its plots: TERRACE_BENCH_PLOT_DIR,
// or terrace-bench under the temporary directory.
func plotDir() string {
	if d := os.Getenv("TERRACE_BENCH_PLOT_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "terrace-bench")
}

// writeReadyPlot draws the number done over time of each curve, as steps,
// into a PNG at path.
func writeReadyPlot(path, title string, curves ...readyCurve) error {
	img := image.NewRGBA(image.Rect(0, 0, plotWidth, plotHeight))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	var end time.Duration
	n := 0
	for _, c := range curves {
		slices.Sort(c.done)
		if len(c.done) > 0 {
			end = max(end, c.done[len(c.done)-1])
		}
		n = max(n, len(c.done))
	}
	if end <= 0 || n == 0 {
		return fmt.Errorf("nothing to plot")
	}
	x := func(d time.Duration) int {
		return plotLeft + int(float64(plotWidth-plotLeft-plotRight)*float64(d)/float64(end))
	}
	y := func(k int) int { return plotHeight - plotBottom - (plotHeight-plotTop-plotBottom)*k/n }
	for i := 0; i <= 4; i++ {
		line(img, plotLeft, y(n*i/4), plotWidth-plotRight, y(n*i/4), plotGrid)
		label(img, 8, y(n*i/4)+4, fmt.Sprint(n*i/4), plotInk)
		at := end * time.Duration(i) / 4
		line(img, x(at), plotTop, x(at), plotHeight-plotBottom, plotGrid)
		label(img, x(at)-12, plotHeight-plotBottom+18, fmt.Sprintf("%.0fs", at.Seconds()), plotInk)
	}
	line(img, plotLeft, plotHeight-plotBottom, plotWidth-plotRight, plotHeight-plotBottom, plotInk)
	line(img, plotLeft, plotTop, plotLeft, plotHeight-plotBottom, plotInk)
	label(img, plotLeft, 20, title, plotInk)
	label(img, plotWidth/2-60, plotHeight-12, "seconds from the start", plotInk)
	for i, c := range curves {
		px, py := x(0), y(0)
		for k, d := range c.done {
			nx, ny := x(d), y(k+1)
			thick(img, px, py, nx, py, c.color) // flat until the next one is done
			thick(img, nx, py, nx, ny, c.color)
			px, py = nx, ny
		}
		lx := plotLeft + 20
		ly := plotTop + 20 + 18*i
		thick(img, lx, ly-4, lx+24, ly-4, c.color)
		label(img, lx+32, ly, fmt.Sprintf("%s: %d in %.1fs", c.name, len(c.done), c.done[len(c.done)-1].Seconds()), plotInk)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// line draws a horizontal or vertical line.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	if x0 > x1 {
		x0, x1 = x1, x0
	}
	if y0 > y1 {
		y0, y1 = y1, y0
	}
	for px := x0; px <= x1; px++ {
		for py := y0; py <= y1; py++ {
			img.Set(px, py, c)
		}
	}
}

// thick is line, two pixels wide.
func thick(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	line(img, x0, y0, x1, y1, c)
	line(img, x0+1, y0+1, x1+1, y1+1, c)
}

func label(img *image.RGBA, x, y int, text string, c color.Color) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(text)
}
